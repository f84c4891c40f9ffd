// The io_uring engine. One ring per store directory, driven by one thread that both submits and
// reaps, so the ring needs no locking. Submitters hand requests over through a mutex-protected
// queue and an eventfd; a read on that eventfd is kept armed inside the ring, so the thread sleeps
// in exactly one place (io_uring_submit_and_wait) and wakes for either new work or completions.
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "storage/io_engine.h"

namespace offloadd::storage {
namespace {

constexpr uint64_t kWakeTag = 0;  // user_data of the eventfd read; requests use their address
constexpr size_t kMaxRegisteredPiece = size_t{1} << 30;  // the kernel's limit per iovec

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const IoEngineOptions& options) : options_(options) {}

  Status Init() {
    if (options_.faults != nullptr) {
      const int err = options_.faults->BeforeRingSetup();
      if (err < 0) return UnavailableError(std::string("io_uring_setup: ") + std::strerror(-err));
    }
    const unsigned entries = std::max(4u, options_.queue_depth + 1);
    // COOP_TASKRUN (5.19+): completions are processed when our thread enters the kernel anyway,
    // instead of interrupting it; older kernels reject the flag, so retry without.
    int rc = io_uring_queue_init(entries, &ring_, IORING_SETUP_COOP_TASKRUN);
    if (rc == -EINVAL) rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) {
      return UnavailableError(std::string("io_uring_setup: ") + std::strerror(-rc) +
                              (rc == -EPERM ? " (disabled by kernel.io_uring_disabled or a "
                                              "seccomp filter)"
                                            : ""));
    }
    ring_ok_ = true;
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    if (probe == nullptr) return UnavailableError("io_uring probe failed (kernel older than 5.6)");
    const bool ops_ok = io_uring_opcode_supported(probe, IORING_OP_READ) &&
                        io_uring_opcode_supported(probe, IORING_OP_WRITE) &&
                        io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) &&
                        io_uring_opcode_supported(probe, IORING_OP_WRITE_FIXED);
    io_uring_free_probe(probe);
    if (!ops_ok) return UnavailableError("io_uring lacks READ/WRITE(_FIXED) opcodes");

    event_fd_ = ::eventfd(0, EFD_CLOEXEC);
    if (event_fd_ < 0) return ErrnoError(errno, "eventfd");

    // Registered files save an fget/fput per request; failure only costs that.
    rc = io_uring_register_files(&ring_, &options_.fd, 1);
    fixed_file_ = rc == 0;
    if (!fixed_file_) {
      OFFLOADD_LOG(kWarning, "storage")
          << "dir " << options_.dir << ": io_uring_register_files: " << std::strerror(-rc);
    }

    for (auto region : options_.buffers) {
      for (size_t off = 0; off < region.size(); off += kMaxRegisteredPiece) {
        const size_t len = std::min(kMaxRegisteredPiece, region.size() - off);
        iovecs_.push_back({region.data() + off, len});
      }
    }
    if (!iovecs_.empty()) {
      rc = io_uring_register_buffers(&ring_, iovecs_.data(), static_cast<unsigned>(iovecs_.size()));
      if (rc < 0) {
        OFFLOADD_LOG(kWarning, "storage")
            << "dir " << options_.dir << ": io_uring_register_buffers of " << iovecs_.size()
            << " regions failed (" << std::strerror(-rc)
            << "); transfers use unregistered buffers. " << RaiseMemlockLimit();
        iovecs_.clear();
      }
      std::sort(iovecs_.begin(), iovecs_.end(),
                [](const iovec& a, const iovec& b) { return a.iov_base < b.iov_base; });
    }
    ArmWake();
    io_uring_submit(&ring_);
    thread_ = std::thread([this] { Loop(); });
    return OkStatus();
  }

  ~UringEngine() override {
    if (thread_.joinable()) {
      {
        std::lock_guard lock(mu_);
        stopping_ = true;
      }
      Wake();
      thread_.join();
    }
    if (ring_ok_) io_uring_queue_exit(&ring_);
    if (event_fd_ >= 0) ::close(event_fd_);
  }

  std::string_view name() const override { return "io_uring"; }
  std::string description() const override {
    size_t bytes = 0;
    for (const auto& v : iovecs_) bytes += v.iov_len;
    return std::string(fixed_file_ ? "registered file" : "unregistered file") + ", " +
           std::to_string(iovecs_.size()) + " registered buffers (" + std::to_string(bytes >> 20) +
           " MiB), queue_depth " + std::to_string(options_.queue_depth);
  }
  uint64_t in_flight() const override { return in_flight_.load(std::memory_order_relaxed); }

  void Submit(IoRequest* req) override {
    req->transferred = 0;
    req->buf_index = FindBuffer(req->buf, req->len);
    // Wake under the lock: once the ring thread takes the request it may complete and the
    // engine be destroyed (closing the eventfd). From a completion callback (on the ring
    // thread) the loop refills right after the callbacks, so no wake-up is needed.
    std::lock_guard lock(mu_);
    incoming_.push_back(req);
    if (std::this_thread::get_id() != ring_thread_id_.load(std::memory_order_relaxed)) Wake();
  }

 private:
  int FindBuffer(const uint8_t* p, uint64_t len) const {
    auto it =
        std::upper_bound(iovecs_.begin(), iovecs_.end(), p, [](const uint8_t* q, const iovec& v) {
          return q < static_cast<const uint8_t*>(v.iov_base);
        });
    if (it == iovecs_.begin()) return -1;
    --it;
    const auto* base = static_cast<const uint8_t*>(it->iov_base);
    if (p + len > base + it->iov_len) return -1;
    return static_cast<int>(it - iovecs_.begin());
  }

  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof one);
  }

  void ArmWake() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_read(sqe, event_fd_, &wake_buf_, sizeof wake_buf_, 0);
    io_uring_sqe_set_data64(sqe, kWakeTag);
  }

  // Prepares the next piece of `req`; returns false when the fault seam failed it outright.
  bool Issue(IoRequest* req) {
    uint64_t want = req->len - req->transferred;
    const uint64_t off = req->offset + req->transferred;
    if (options_.faults != nullptr) {
      const int64_t f = options_.faults->BeforeTransfer(req->op, options_.dir, off, want);
      if (f < 0) {
        immediate_.push_back({req, f});
        return false;
      }
      if (f > 0 && static_cast<uint64_t>(f) < want) want = static_cast<uint64_t>(f);
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {  // cannot happen: entries > queue_depth; flush and retry once
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    uint8_t* p = req->buf + req->transferred;
    const int fd = fixed_file_ ? 0 : options_.fd;
    const auto n = static_cast<unsigned>(want);
    if (req->buf_index >= 0) {
      if (req->op == IoOp::kRead) {
        io_uring_prep_read_fixed(sqe, fd, p, n, off, req->buf_index);
      } else {
        io_uring_prep_write_fixed(sqe, fd, p, n, off, req->buf_index);
      }
    } else if (req->op == IoOp::kRead) {
      io_uring_prep_read(sqe, fd, p, n, off);
    } else {
      io_uring_prep_write(sqe, fd, p, n, off);
    }
    if (fixed_file_) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, req);
    ++ring_in_flight_;
    in_flight_.store(ring_in_flight_, std::memory_order_relaxed);
    return true;
  }

  void Complete(IoRequest* req, int64_t res) {
    if (res < 0 && (res == -EAGAIN || res == -EINTR)) {
      Issue(req);
      return;
    }
    if (res < 0) {
      finished_.push_back({req, res});
      return;
    }
    if (res == 0) {
      finished_.push_back(
          {req, req->op == IoOp::kRead ? static_cast<int64_t>(req->transferred) : int64_t{-EIO}});
      return;
    }
    req->transferred += static_cast<uint64_t>(res);
    if (req->transferred < req->len) {
      Issue(req);  // short transfer: resubmit the remainder
      return;
    }
    finished_.push_back({req, static_cast<int64_t>(req->len)});
  }

  // Moves submitted requests into `waiting_` and issues as many as the queue depth allows.
  // Returns whether the engine is stopping.
  bool Refill() {
    bool stopping;
    {
      std::lock_guard lock(mu_);
      while (!incoming_.empty()) {
        waiting_.push_back(incoming_.front());
        incoming_.pop_front();
      }
      stopping = stopping_;
    }
    if (stopping) {
      for (IoRequest* r : waiting_) finished_.push_back({r, -ECANCELED});
      waiting_.clear();
    }
    while (!waiting_.empty() && ring_in_flight_ < options_.queue_depth) {
      Issue(waiting_.front());
      waiting_.pop_front();
    }
    // Seam-failed transfers complete here, outside the ring.
    for (auto& [req, res] : immediate_) finished_.push_back({req, res});
    immediate_.clear();
    return stopping;
  }

  void Loop() {
    ring_thread_id_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    for (;;) {
      const bool stopping = Refill();
      // Callbacks may have submitted more without a wake-up: refill before sleeping.
      if (RunCallbacks()) continue;
      if (stopping && ring_in_flight_ == 0) {
        std::lock_guard lock(mu_);
        if (incoming_.empty()) break;
        continue;
      }
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        OFFLOADD_LOG(kError, "storage")
            << "dir " << options_.dir << ": io_uring_submit_and_wait: " << std::strerror(-rc);
      }
      io_uring_cqe* cqe;
      unsigned head;
      unsigned seen = 0;
      bool rearm = false;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        if (cqe->user_data == kWakeTag) {
          rearm = true;
          continue;
        }
        auto* req = static_cast<IoRequest*>(io_uring_cqe_get_data(cqe));
        --ring_in_flight_;
        Complete(req, cqe->res);
      }
      io_uring_cq_advance(&ring_, seen);
      if (rearm) ArmWake();
      // Keep the device busy while the callbacks (checksums, copies) run: refill the ring from
      // the waiting queue and submit before running them.
      Refill();
      io_uring_submit(&ring_);
      in_flight_.store(ring_in_flight_, std::memory_order_relaxed);
      RunCallbacks();
    }
  }

  // Returns whether any callback ran.
  bool RunCallbacks() {
    // Callbacks may Submit() (which only touches incoming_), never the ring directly.
    if (finished_.empty()) return false;
    std::vector<std::pair<IoRequest*, int64_t>> done;
    done.swap(finished_);
    for (auto& [req, res] : done) req->done(res);
    return true;
  }

  IoEngineOptions options_;
  io_uring ring_{};
  bool ring_ok_ = false;
  bool fixed_file_ = false;
  int event_fd_ = -1;
  uint64_t wake_buf_ = 0;
  std::vector<iovec> iovecs_;
  std::thread thread_;
  std::atomic<std::thread::id> ring_thread_id_{};

  std::mutex mu_;
  std::deque<IoRequest*> incoming_;
  bool stopping_ = false;

  // Owned by the ring thread.
  unsigned ring_in_flight_ = 0;
  std::deque<IoRequest*> waiting_;
  std::vector<std::pair<IoRequest*, int64_t>> immediate_;
  std::vector<std::pair<IoRequest*, int64_t>> finished_;
  std::atomic<uint64_t> in_flight_{0};
};

}  // namespace

StatusOr<std::unique_ptr<IoEngine>> MakeUringEngine(const IoEngineOptions& options) {
  auto engine = std::make_unique<UringEngine>(options);
  Status st = engine->Init();
  if (!st.ok()) return st;
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace offloadd::storage
