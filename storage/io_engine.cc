// The pread/pwrite fallback engine: a pool of `queue_depth` (at most 64) threads taking requests
// from one FIFO queue. Used when io_uring is unavailable or restricted (e.g. seccomp in
// containers, kernel.io_uring_disabled), so it must be correct rather than fast.
#include "storage/io_engine.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace offloadd::storage {
namespace {

class ThreadEngine final : public IoEngine {
 public:
  explicit ThreadEngine(const IoEngineOptions& options) : options_(options) {
    const unsigned n = std::max(1u, std::min(options.queue_depth, 64u));
    threads_.reserve(n);
    for (unsigned i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
  }

  ~ThreadEngine() override {
    std::deque<IoRequest*> cancelled;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      cancelled.swap(queue_);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    for (IoRequest* r : cancelled) r->done(-ECANCELED);
  }

  std::string_view name() const override { return "threads"; }
  std::string description() const override {
    return "pread/pwrite pool of " + std::to_string(threads_.size()) + " threads";
  }
  uint64_t in_flight() const override { return in_flight_.load(std::memory_order_relaxed); }

  void Submit(IoRequest* req) override {
    req->transferred = 0;
    // Notify under the lock: once popped, the request may complete and its store (and this
    // engine) be destroyed.
    std::lock_guard lock(mu_);
    queue_.push_back(req);
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      IoRequest* req;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping
        req = queue_.front();
        queue_.pop_front();
      }
      in_flight_.fetch_add(1, std::memory_order_relaxed);
      const int64_t res = Transfer(req);
      in_flight_.fetch_sub(1, std::memory_order_relaxed);
      req->done(res);
    }
  }

  int64_t Transfer(IoRequest* req) {
    while (req->transferred < req->len) {
      uint64_t want = req->len - req->transferred;
      const uint64_t off = req->offset + req->transferred;
      if (options_.faults != nullptr) {
        const int64_t f = options_.faults->BeforeTransfer(req->op, options_.dir, off, want);
        if (f < 0) return f;
        if (f > 0 && static_cast<uint64_t>(f) < want) want = static_cast<uint64_t>(f);
      }
      uint8_t* p = req->buf + req->transferred;
      const ssize_t n = req->op == IoOp::kRead
                            ? ::pread(options_.fd, p, want, static_cast<off_t>(off))
                            : ::pwrite(options_.fd, p, want, static_cast<off_t>(off));
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return -errno;
      }
      if (n == 0) {
        // End of file on a read; a write that makes no progress would loop forever.
        return req->op == IoOp::kRead ? static_cast<int64_t>(req->transferred) : -EIO;
      }
      req->transferred += static_cast<uint64_t>(n);
    }
    return static_cast<int64_t>(req->len);
  }

  const IoEngineOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IoRequest*> queue_;
  bool stopping_ = false;
  std::atomic<uint64_t> in_flight_{0};
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<IoEngine> MakeThreadEngine(const IoEngineOptions& options) {
  return std::make_unique<ThreadEngine>(options);
}

std::string RaiseMemlockLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) != 0) return "getrlimit(RLIMIT_MEMLOCK) failed";
  rlimit want{RLIM_INFINITY, RLIM_INFINITY};
  if (::setrlimit(RLIMIT_MEMLOCK, &want) == 0) return "RLIMIT_MEMLOCK raised to unlimited";
  if (lim.rlim_cur < lim.rlim_max) {
    want = {lim.rlim_max, lim.rlim_max};
    if (::setrlimit(RLIMIT_MEMLOCK, &want) == 0) {
      lim.rlim_cur = lim.rlim_max;
    }
  }
  const std::string cur = lim.rlim_cur == RLIM_INFINITY
                              ? std::string("unlimited")
                              : std::to_string(lim.rlim_cur / 1024) + " KiB";
  return "RLIMIT_MEMLOCK stays at " + cur +
         " (raising it needs CAP_SYS_RESOURCE; with CAP_IPC_LOCK io_uring pins buffers anyway, "
         "otherwise set `LimitMEMLOCK=infinity` in the systemd unit or `ulimit -l unlimited`)";
}

}  // namespace offloadd::storage
