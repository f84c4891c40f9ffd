// offloadd-store: the NVMe tensor store process. Thin: parses flags into StoreOptions, performs
// the handshake of store_protocol.h on --control-fd, and hands over to StoreServer. Also offers
// offline --list and --verify (read back every tensor, checking every chunk's crc32c).
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/units.h"
#include "ipc/arena.h"
#include "ipc/fd_passing.h"
#include "ipc/shm_segment.h"
#include "storage/store_metrics.h"
#include "storage/store_protocol.h"
#include "storage/store_server.h"
#include "storage/tensor_store.h"

namespace offloadd::storage {
namespace {

constexpr char kUsage[] = R"(usage: offloadd-store --dir=PATH[:WEIGHT] [--dir=...] [options]
Serves tensor reads and writes for the offloadd daemon from NVMe store directories.

  --dir=PATH[:WEIGHT]     store directory (one per SSD; repeat, order matters); WEIGHT is its
                          share of each tensor's chunks (default 1)
  --block-size=SIZE       aio.block_size: bytes per I/O and checksum chunk (default 1MiB)
  --queue-depth=N         aio.queue_depth: I/Os in flight per directory (default 32)
  --io-engine=E           auto | io_uring | threads (default auto: io_uring, else threads)
  --direct-io=M           auto | on | off (default auto: O_DIRECT where the filesystem allows)
  --control-fd=N          Unix socket from the daemon (store_protocol.h handshake)
  --metrics-listen=H:P    serve Prometheus metrics at http://H:P/metrics (port 0: any)
  --log-level=L           debug | info | warning | error
  --validate-config       check the flags, print the effective settings, exit
  --list                  open the store, print every tensor's key/version/size, exit
  --verify                open the store, read every tensor back verifying checksums, exit
)";

struct Flags {
  StoreOptions store;
  int control_fd = -1;
  std::string metrics_listen;
  bool validate = false, list = false, verify = false;
};

StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (arg == "--validate-config") { f.validate = true; continue; }
    if (arg == "--list") { f.list = true; continue; }
    if (arg == "--verify") { f.verify = true; continue; }
    std::string name = arg, value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return InvalidArgumentError(arg + ": missing value");
    }
    auto parse_uint = [&](uint64_t max) -> StatusOr<uint64_t> {
      char* end = nullptr;
      errno = 0;
      const unsigned long long v = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno != 0 || v > max) {
        return InvalidArgumentError(name + ": expected an integer <= " + std::to_string(max) + ", got '" + value + "'");
      }
      return static_cast<uint64_t>(v);
    };
    if (name == "--dir") {
      StoreDirectory d{value, 1.0};
      if (auto colon = value.rfind(':'); colon != std::string::npos) {
        char* end = nullptr;
        const double w = std::strtod(value.c_str() + colon + 1, &end);
        if (end != value.c_str() + colon + 1 && *end == '\0') {
          d.path = value.substr(0, colon);
          d.weight = w;
        }
      }
      f.store.directories.push_back(d);
    } else if (name == "--block-size") {
      ASSIGN_OR_RETURN(uint64_t v, ParseByteSize(value));
      if (v > UINT32_MAX) return InvalidArgumentError("--block-size: too large");
      f.store.block_size = static_cast<uint32_t>(v);
    } else if (name == "--queue-depth") {
      ASSIGN_OR_RETURN(uint64_t v, parse_uint(4096));
      f.store.queue_depth = static_cast<uint32_t>(v);
    } else if (name == "--io-engine") {
      static const std::map<std::string, IoEngineChoice> kEngines = {
          {"auto", IoEngineChoice::kAuto}, {"io_uring", IoEngineChoice::kIoUring}, {"threads", IoEngineChoice::kThreads}};
      auto it = kEngines.find(value);
      if (it == kEngines.end()) return InvalidArgumentError("--io-engine: expected auto, io_uring or threads, got '" + value + "'");
      f.store.io_engine = it->second;
    } else if (name == "--direct-io") {
      static const std::map<std::string, DirectIoMode> kModes = {
          {"auto", DirectIoMode::kAuto}, {"on", DirectIoMode::kOn}, {"off", DirectIoMode::kOff}};
      auto it = kModes.find(value);
      if (it == kModes.end()) return InvalidArgumentError("--direct-io: expected auto, on or off, got '" + value + "'");
      f.store.direct_io = it->second;
    } else if (name == "--control-fd") {
      ASSIGN_OR_RETURN(uint64_t v, parse_uint(1 << 20));
      f.control_fd = static_cast<int>(v);
    } else if (name == "--metrics-listen") {
      f.metrics_listen = value;
    } else if (name == "--log-level") {
      LogSeverity s;
      if (!ParseLogSeverity(value, &s)) return InvalidArgumentError("--log-level: unknown level '" + value + "'");
      SetMinLogSeverity(s);
    } else {
      return InvalidArgumentError("unknown flag " + name + " (see --help)");
    }
  }
  RETURN_IF_ERROR(ValidateStoreOptions(f.store));
  return f;
}

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

int ListOrVerify(const Flags& f) {
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
                static_cast<unsigned long long>(t.version), static_cast<unsigned long long>(t.size), verdict.c_str());
  }
  std::printf("%zu tensors, %s%s\n", (*store)->List().size(), FormatByteSize(total).c_str(),
              f.verify ? (bad == 0 ? ", all checksums verified" : (", " + std::to_string(bad) + " FAILED").c_str()) : "");
  return bad == 0 ? 0 : 2;
}

int Serve(Flags f) {
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
    SendReady(f.control_fd, FailedPreconditionError("daemon speaks store protocol version " +
                                                    std::to_string(hello.version) + ", this binary " +
                                                    std::to_string(kStoreProtocolVersion)), "");
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
  auto done_q = arena.ok() ? ipc::RingQueue<ipc::CommandRecord>::Attach(*arena, hello.completion_queue)
                           : StatusOr<ipc::RingQueue<ipc::CommandRecord>>(arena.status());
  if (!cmd_q.ok() || !done_q.ok()) {
    SendReady(f.control_fd, (!cmd_q.ok() ? cmd_q.status() : done_q.status()).WithContext("attaching rings"), "");
    return 1;
  }
  f.store.registered_buffers = {{reinterpret_cast<std::byte*>(seg->base()), seg->total_size()}};
  auto store = TensorStore::Open(f.store);
  if (!store.ok()) {
    OFFLOADD_LOG(kError, "storage") << store.status().ToString();
    SendReady(f.control_fd, store.status(), "");
    return 1;
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  uint32_t metrics_port = 0;
  auto registry = std::make_shared<prometheus::Registry>();
  auto collector = std::make_shared<StoreCollector>(store->get());
  if (!f.metrics_listen.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(f.metrics_listen);
      exposer->RegisterCollectable(collector);
      metrics_port = exposer->GetListeningPorts().front();
      OFFLOADD_LOG(kInfo, "storage") << "metrics at http://" << f.metrics_listen.substr(0, f.metrics_listen.rfind(':'))
                                     << ":" << metrics_port << "/metrics";
    } catch (const std::exception& e) {
      Status st = InvalidArgumentError("--metrics-listen " + f.metrics_listen + ": " + e.what());
      SendReady(f.control_fd, st, "");
      return 1;
    }
  }
  SendReady(f.control_fd, OkStatus(), (*store)->engine_name(), metrics_port);
  StoreServer server(store->get(), &*arena,
                     ipc::Channel<ipc::CommandRecord>(*cmd_q, fds[1].get(), fds[2].get()),
                     ipc::Channel<ipc::CommandRecord>(*done_q, fds[3].get(), fds[4].get()), f.control_fd);
  Status st = server.Run();
  OFFLOADD_LOG(kInfo, "storage") << "served " << server.commands_served() << " commands; "
                                 << (st.ok() ? "shut down on request" : "daemon gone (" + st.message() + ")");
  return 0;
}

}  // namespace
}  // namespace offloadd::storage

int main(int argc, char** argv) {
  using namespace offloadd::storage;
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "offloadd-store: %s\n%s", flags.status().ToString().c_str(), kUsage);
    return 2;
  }
  if (flags->validate) {
    const auto& o = flags->store;
    for (const auto& d : o.directories) std::printf("dir %s weight %g\n", d.path.c_str(), d.weight);
    std::printf("aio.block_size %s\naio.queue_depth %u\n", offloadd::FormatByteSize(o.block_size).c_str(), o.queue_depth);
    std::printf("config OK\n");
    return 0;
  }
  if (flags->list || flags->verify) return ListOrVerify(*flags);
  if (flags->control_fd < 0) {
    std::fprintf(stderr, "offloadd-store: nothing to do: pass --control-fd (when started by the daemon), --list or --verify\n");
    return 2;
  }
  return Serve(std::move(*flags));
}
