#include "storage/store_server.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/logging.h"

namespace offloadd::storage {
namespace {

// A completion carries 87 characters of message. Long store errors read "store directory D:
// <what>: <reason>"; keep the reason and the directory, which the requester cannot know (it knows
// the key from the id). The store logs the full message.
std::string CompactMessage(const std::string& m) {
  constexpr size_t kMax = sizeof(StoreCompletion::message) - 1;
  if (m.size() <= kMax) return m;
  const size_t cut = m.rfind(": ");
  std::string reason = cut == std::string::npos ? m : m.substr(cut + 2);
  std::string dir;
  if (const size_t d = m.find("store directory "); d != std::string::npos) {
    const size_t start = d + 16;
    dir = m.substr(start, m.find(':', start) - start);
  }
  std::string out = reason;
  if (!dir.empty() && reason.size() + 9 < kMax) {
    const size_t room = kMax - reason.size() - 8;
    if (dir.size() > room) dir = "..." + dir.substr(dir.size() - (room - 3));
    out += " (dir " + dir + ")";
  }
  return out.substr(0, kMax);
}

// Completions from TensorStore threads, funnelled to the ring's single producer thread.
class CompletionPump {
 public:
  CompletionPump(ipc::Channel<ipc::CommandRecord> channel, int abort_fd)
      : channel_(channel), abort_fd_(abort_fd), thread_([this] { Loop(); }) {}

  ~CompletionPump() {
    {
      std::unique_lock lock(mu_);
      idle_.wait(lock, [this] { return outstanding_ == 0; });
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void WaitIdle() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [this] { return outstanding_ == 0; });
  }

  void Expect() {
    std::lock_guard lock(mu_);
    ++outstanding_;
  }

  void Post(uint64_t id, StoreOp op, const TensorKey& key, const Status& st, uint64_t version,
            uint64_t bytes) {
    ipc::CommandRecord r{};
    r.kind = static_cast<uint32_t>(StoreOp::kCompletion);
    r.id = id;
    StoreCompletion c;
    c.code = static_cast<int32_t>(st.code());
    c.op = static_cast<uint32_t>(op);
    c.version = version;
    c.bytes = bytes;
    CopyName(c.message, CompactMessage(st.message()));
    r.Pack(c);
    if (!st.ok()) {
      OFFLOADD_LOG(kWarning, "storage")
          << "command " << id << " (" << KeyString(key) << ") failed: " << st.ToString();
    }
    // Notify under the lock: once the record is popped, the pump may be destroyed.
    std::lock_guard lock(mu_);
    queue_.push_back(r);
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      ipc::CommandRecord r;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        r = queue_.front();
        queue_.pop_front();
      }
      if (!peer_gone_) {
        Status st = channel_.Push(r, -1, abort_fd_);
        if (!st.ok()) {
          // Nobody will read it: keep draining so the commands still finish and the store
          // can exit with everything committed.
          peer_gone_ = true;
          OFFLOADD_LOG(kWarning, "storage") << "completion ring: " << st.ToString()
                                            << "; finishing in-flight work without answers";
        }
      }
      std::lock_guard lock(mu_);
      if (--outstanding_ == 0) idle_.notify_all();
    }
  }

  ipc::Channel<ipc::CommandRecord> channel_;
  int abort_fd_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<ipc::CommandRecord> queue_;
  uint64_t outstanding_ = 0;
  bool stopping_ = false;
  bool peer_gone_ = false;
  std::thread thread_;
};

}  // namespace

Status StoreServer::Run() {
  CompletionPump pump(completions_, abort_fd_);
  for (;;) {
    ipc::CommandRecord r;
    Status st = commands_.Pop(&r, -1, abort_fd_);
    if (!st.ok()) {
      OFFLOADD_LOG(kInfo, "storage")
          << "command ring: " << st.ToString() << "; finishing in-flight work and exiting";
      return st;  // ~CompletionPump waits for in-flight commands
    }
    ++served_;
    const auto op = static_cast<StoreOp>(r.kind);
    const auto cmd = r.Unpack<StoreCommand>();
    const uint64_t id = r.id;
    if (op == StoreOp::kShutdown) {
      // Answered only after everything accepted before it has completed.
      pump.WaitIdle();
      pump.Expect();
      pump.Post(id, op, cmd.key(), OkStatus(), 0, 0);
      return OkStatus();
    }
    pump.Expect();
    switch (op) {
      case StoreOp::kWrite:
      case StoreOp::kRead: {
        Status range = cmd.bytes == 0 ? OkStatus() : arena_->Check(cmd.offset, cmd.bytes);
        if (!range.ok()) {
          pump.Post(id, op, cmd.key(), range, cmd.version, cmd.bytes);
          break;
        }
        auto* p = arena_->At<std::byte>(cmd.offset);
        if (op == StoreOp::kWrite) {
          store_->Write(cmd.key(), cmd.version, {p, cmd.bytes}, [&pump, id, cmd](Status s) {
            pump.Post(id, StoreOp::kWrite, cmd.key(), s, cmd.version, cmd.bytes);
          });
        } else {
          store_->Read(cmd.key(), cmd.version, {p, cmd.bytes},
                       [&pump, id, cmd](StatusOr<TensorInfo> info) {
                         pump.Post(id, StoreOp::kRead, cmd.key(), info.status(),
                                   info.ok() ? info->version : cmd.version, cmd.bytes);
                       });
        }
        break;
      }
      case StoreOp::kDrop:
        store_->Drop(cmd.key(), [&pump, id, cmd](Status s) {
          pump.Post(id, StoreOp::kDrop, cmd.key(), s, cmd.version, 0);
        });
        break;
      default:
        pump.Post(id, op, cmd.key(),
                  InvalidArgumentError("unknown store command kind " + std::to_string(r.kind)), 0,
                  0);
    }
  }
}

}  // namespace offloadd::storage
