#include "daemon/server/watch_stream.h"

#include <atomic>
#include <chrono>
#include <optional>

#include "daemon/server/status_util.h"

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

namespace {
constexpr int kReadBatch = 256;  // events read from the store at a time
}  // namespace

// What the reading thread, gRPC's callbacks and the job manager's wake-ups share about one stream.
// `mu` guards every field but the atomics; nobody calls into gRPC or the manager with it held.
struct WatchStreams::Core {
  std::mutex mu;
  Stream* stream = nullptr;  // null once the stream is done
  std::string job_id;
  bool progress = true, logs = true;  // which events the client asked for
  bool until_now = false;             // end after the events there are now (no following)
  int64_t cursor = 0;                 // the last event read
  std::deque<v1::JobEvent> batch;     // read, not yet written
  bool more = false;                  // the last read returned events: read again without news
  bool complete = false;              // the job is final and every event is read
  Status error;                       // the read failed: the stream ends with it
  bool writing = false;               // a write is in flight
  bool cancelled = false;             // the client went away
  bool finishing = false;             // Finish was called
  std::atomic<bool> news{false};      // an event came since the last read
  std::atomic<bool> queued{false};    // in WatchStreams::ready_
};

class WatchStreams::Stream : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  Stream(WatchStreams* owner, std::shared_ptr<Core> core, std::optional<ClientQuota::Lease> slot)
      : owner_(owner),
        core_(std::move(core)),
        slot_(std::move(slot)),
        start_(std::chrono::steady_clock::now()) {}

  void Subscribe() {
    handle_ = owner_->jobs_->Subscribe(core_->job_id, [owner = owner_, core = core_] {
      core->news = true;
      owner->Enqueue(core);
    });
    subscribed_ = true;
  }

  void Refuse(const Status& why) {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->finishing = true;
    }
    status_ = ToGrpcStatus(why);
    Finish(status_);
  }

  // Starts what comes next: the next write, the end of the stream, or another read. Called with
  // the core's lock held; releases it before calling into gRPC or the reading thread.
  void Advance(std::unique_lock<std::mutex> lock) {
    Core& c = *core_;
    if (c.finishing || c.writing) return;
    if (c.cancelled || (c.batch.empty() && (c.complete || !c.error.ok()))) {
      c.finishing = true;
      status_ = c.cancelled ? grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away")
                            : ToGrpcStatus(c.error);
      lock.unlock();
      Finish(status_);
      return;
    }
    if (!c.batch.empty()) {
      current_ = std::move(c.batch.front());
      c.batch.pop_front();
      c.writing = true;
      lock.unlock();
      StartWrite(&current_);
      return;
    }
    const bool read_again = c.more || c.news;
    lock.unlock();
    if (read_again) owner_->Enqueue(core_);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(core_->mu);
    core_->writing = false;
    if (!ok) core_->cancelled = true;
    Advance(std::move(lock));
  }

  // The client cancelled or went away: end now, and so free the slot (OnDone follows Finish).
  void OnCancel() override {
    std::unique_lock<std::mutex> lock(core_->mu);
    core_->cancelled = true;
    Advance(std::move(lock));
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->stream = nullptr;
    }
    if (subscribed_) owner_->jobs_->Unsubscribe(core_->job_id, handle_);
    slot_.reset();
    if (owner_->metrics_ != nullptr) {
      const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
      owner_->metrics_->RecordRpc("WatchJob", GrpcCodeName(status_), d.count());
    }
    delete this;
  }

 private:
  WatchStreams* owner_;
  std::shared_ptr<Core> core_;
  std::optional<ClientQuota::Lease> slot_;
  const std::chrono::steady_clock::time_point start_;
  uint64_t handle_ = 0;
  bool subscribed_ = false;
  v1::JobEvent current_;  // the event being written
  grpc::Status status_;   // how the stream ended
};

WatchStreams::WatchStreams(JobManager* jobs, DaemonMetrics* metrics)
    : jobs_(jobs), metrics_(metrics), reader_([this] { ReadLoop(); }) {}

WatchStreams::~WatchStreams() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_cv_.notify_all();
  reader_.join();
}

grpc::ServerWriteReactor<v1::JobEvent>* WatchStreams::Start(
    grpc::CallbackServerContext* /*context*/, const v1::WatchJobRequest& request,
    StatusOr<ClientQuota::Lease> slot) {
  auto core = std::make_shared<Core>();
  core->job_id = request.job_id();
  core->cursor = request.after_cursor();
  core->progress = !request.has_include_progress() || request.include_progress();
  core->logs = !request.has_include_logs() || request.include_logs();
  core->until_now = request.until_now();
  if (!slot.ok()) {
    auto* refused = new Stream(this, core, std::nullopt);
    refused->Refuse(slot.status());
    return refused;
  }
  auto* stream = new Stream(this, core, std::move(*slot));
  if (jobs_ == nullptr) {
    stream->Refuse(FailedPreconditionError("this daemon has no job manager"));
    return stream;
  }
  core->stream = stream;
  stream->Subscribe();
  core->news = true;
  Enqueue(core);
  return stream;
}

void WatchStreams::Enqueue(const std::shared_ptr<Core>& core) {
  if (core->queued.exchange(true)) return;  // already waiting to be read
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(core);
  }
  ready_cv_.notify_one();
}

void WatchStreams::ReadLoop() {
  while (true) {
    std::shared_ptr<Core> core;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_cv_.wait(lock, [&] { return stopping_ || !ready_.empty(); });
      if (stopping_) return;
      core = std::move(ready_.front());
      ready_.pop_front();
    }
    Pump(core);
  }
}

// Reads the stream's next events (no lock held while the store is read) and starts writing them.
void WatchStreams::Pump(const std::shared_ptr<Core>& core) {
  core->queued = false;
  int64_t cursor;
  {
    std::lock_guard<std::mutex> lock(core->mu);
    // Busy: Advance reads again once the writes are done (the news flag stays set).
    if (core->stream == nullptr || core->finishing || core->writing || !core->batch.empty()) return;
    cursor = core->cursor;
    core->news = false;
  }
  bool complete = false;
  auto events = jobs_->ReadWatch(core->job_id, cursor, kReadBatch, &complete);
  std::unique_lock<std::mutex> lock(core->mu);
  if (core->stream == nullptr || core->finishing) return;
  if (!events.ok()) {
    core->error = events.status();
  } else {
    for (v1::JobEvent& e : *events) {
      core->cursor = e.cursor();
      if ((e.has_progress() && !core->progress) || (e.has_log() && !core->logs)) continue;
      core->batch.push_back(std::move(e));
    }
    // After events, read again once they are written: more may be waiting (a full batch), or the
    // job may have ended with the last of them (an empty read then says so).
    core->more = !events->empty();
    // until_now: the first read that finds nothing new ends the stream.
    core->complete = complete || (core->until_now && events->empty());
  }
  core->stream->Advance(std::move(lock));
}

}  // namespace offloadd::daemon
