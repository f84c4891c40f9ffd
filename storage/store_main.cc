// offloadd-store: the NVMe tensor store process. Thin: parses flags into StoreOptions, performs
// the handshake of store_protocol.h on --control-fd, and hands over to StoreServer. Also offers
// offline --list and --verify (read back every tensor, checking every chunk's crc32c).

#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/metrics_exposer.h"
#include "common/units.h"
#include "ipc/arena.h"
#include "ipc/fd_passing.h"
#include "ipc/shm_segment.h"
#include "storage/store_flags.h"
#include "storage/store_metrics.h"
#include "storage/store_protocol.h"
#include "storage/store_server.h"
#include "storage/tensor_store.h"

namespace offloadd::storage {
namespace {

void SendReady(int fd, const Status& st, std::string_view engine, uint32_t metrics_port = 0) {
  StoreReady ready;
  ready.metrics_port = metrics_port;
  ready.code = static_cast<int32_t>(st.code());
  CopyName(ready.message, st.message());
  CopyName(ready.engine, engine);
  Status sent = ipc::SendFds(fd, {}, {reinterpret_cast<const uint8_t*>(&ready), sizeof ready});
  if (!sent.ok()) {
    OFFLOADD_LOG(kError, "storage") << "sending ready: " << sent.ToString();
  }
}

int ListOrVerify(const StoreFlags& f) {
  auto store = TensorStore::Open(f.store);
  if (!store.ok()) {
    std::fprintf(stderr, "offloadd-store: %s\n", store.status().ToString().c_str());
    return 1;
  }
  int bad = 0;
  uint64_t total = 0;
  for (const TensorInfo& t : (*store)->List()) {
    std::string verdict;
    if (f.verify) {
      std::vector<std::byte> buf(t.size);
      Status st = (*store)->ReadSync(t.key, t.version, buf).status();
      verdict = st.ok() ? "  ok" : "  FAILED: " + st.ToString();
      bad += st.ok() ? 0 : 1;
    }
    total += t.size;
    std::printf("%s version %llu %llu bytes%s\n", KeyString(t.key).c_str(),
                static_cast<unsigned long long>(t.version), static_cast<unsigned long long>(t.size),
                verdict.c_str());
  }
  std::printf("%zu tensors, %s%s\n", (*store)->List().size(), FormatByteSize(total).c_str(),
              f.verify ? (bad == 0 ? ", all checksums verified"
                                   : (", " + std::to_string(bad) + " FAILED").c_str())
                       : "");
  return bad == 0 ? 0 : 2;
}

int Serve(StoreFlags f) {
  auto hello_msg = ipc::RecvFds(f.control_fd, 5, sizeof(StoreHello));
  if (!hello_msg.ok()) {
    OFFLOADD_LOG(kError, "storage") << "handshake: " << hello_msg.status().ToString();
    return 1;
  }
  StoreHello hello;
  if (hello_msg->payload.size() != sizeof hello || hello_msg->fds.size() != 5) {
    SendReady(f.control_fd, InvalidArgumentError("malformed hello (expected 5 fds)"), "");
    return 1;
  }
  std::memcpy(&hello, hello_msg->payload.data(), sizeof hello);
  if (hello.magic != kStoreHelloMagic || hello.version != kStoreProtocolVersion) {
    SendReady(f.control_fd,
              FailedPreconditionError("daemon speaks store protocol version " +
                                      std::to_string(hello.version) + ", this binary " +
                                      std::to_string(kStoreProtocolVersion)),
              "");
    return 1;
  }
  auto& fds = hello_msg->fds;
  auto seg = ipc::SharedSegment::Attach(fds[0].get());
  if (!seg.ok()) {
    SendReady(f.control_fd, seg.status(), "");
    return 1;
  }
  auto arena = ipc::Arena::Open(&*seg);
  auto cmd_q = arena.ok() ? ipc::RingQueue<ipc::CommandRecord>::Attach(*arena, hello.command_queue)
                          : StatusOr<ipc::RingQueue<ipc::CommandRecord>>(arena.status());
  auto done_q = arena.ok()
                    ? ipc::RingQueue<ipc::CommandRecord>::Attach(*arena, hello.completion_queue)
                    : StatusOr<ipc::RingQueue<ipc::CommandRecord>>(arena.status());
  if (!cmd_q.ok() || !done_q.ok()) {
    SendReady(f.control_fd,
              (!cmd_q.ok() ? cmd_q.status() : done_q.status()).WithContext("attaching rings"), "");
    return 1;
  }
  f.store.registered_buffers = {{reinterpret_cast<std::byte*>(seg->base()), seg->total_size()}};
  auto store = TensorStore::Open(f.store);
  if (!store.ok()) {
    OFFLOADD_LOG(kError, "storage") << store.status().ToString();
    SendReady(f.control_fd, store.status(), "");
    return 1;
  }
  std::unique_ptr<MetricsExposer> exposer;
  uint32_t metrics_port = 0;
  auto collector = std::make_shared<StoreCollector>(store->get());
  if (!f.metrics_listen.empty()) {
    auto started = MetricsExposer::Start(f.metrics_listen);
    if (!started.ok()) {
      SendReady(f.control_fd, started.status().WithContext("--metrics-listen"), "");
      return 1;
    }
    exposer = std::move(*started);
    exposer->RegisterCollectable(collector);
    metrics_port = exposer->port();
    OFFLOADD_LOG(kInfo, "storage") << "metrics at http://" << f.metrics_listen.substr(0, f.metrics_listen.rfind(':'))
                                   << ":" << metrics_port << "/metrics";
  }
  SendReady(f.control_fd, OkStatus(), (*store)->engine_name(), metrics_port);
  StoreServer server(
      store->get(), &*arena, ipc::Channel<ipc::CommandRecord>(*cmd_q, fds[1].get(), fds[2].get()),
      ipc::Channel<ipc::CommandRecord>(*done_q, fds[3].get(), fds[4].get()), f.control_fd);
  Status st = server.Run();
  OFFLOADD_LOG(kInfo, "storage") << "served " << server.commands_served() << " commands; "
                                 << (st.ok() ? "shut down on request"
                                             : "daemon gone (" + st.message() + ")");
  return 0;
}

}  // namespace
}  // namespace offloadd::storage

int main(int argc, char** argv) {
  using namespace offloadd::storage;
  auto flags = ParseStoreFlags(std::vector<std::string>(argv + 1, argv + argc));
  if (!flags.ok()) {
    std::fprintf(stderr, "offloadd-store: %s\n%s", flags.status().ToString().c_str(), kStoreUsage);
    return 2;
  }
  if (flags->help) {
    std::fputs(kStoreUsage, stdout);
    return 0;
  }
  offloadd::SetMinLogSeverity(flags->log_level);
  if (flags->validate) {
    const auto& o = flags->store;
    for (const auto& d : o.directories) std::printf("dir %s weight %g\n", d.path.c_str(), d.weight);
    std::printf("aio.block_size %s\naio.queue_depth %u\n",
                offloadd::FormatByteSize(o.block_size).c_str(), o.queue_depth);
    std::printf("config OK\n");
    return 0;
  }
  if (flags->list || flags->verify) return ListOrVerify(*flags);
  if (flags->control_fd < 0) {
    std::fprintf(stderr,
                 "offloadd-store: nothing to do: pass --control-fd (when started by the daemon), "
                 "--list or --verify\n");
    return 2;
  }
  return Serve(std::move(*flags));
}
