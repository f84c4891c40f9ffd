#pragma once
// JobStore: durable job records and per-job event logs in an embedded SQLite database (WAL mode),
// so a restarted daemon still shows every job and a WatchJob client can resume from a cursor.
//
// Records are the API's own protobuf messages (Job, JobEvent, StepMetrics) stored as serialized
// blobs, with the columns needed for filtering and ordering (state, priority, submission
// sequence, step) kept alongside. A job's progress is kept in a row of its own: a progress report
// writes that small row and its event, never the record with the spec (a 2 MB spec written again at
// every step wrote 60 MiB in 30 steps).
//
// The database file is watched: when it is deleted (or replaced) while the daemon runs, the
// writes would go on into the unlinked file and be lost at the next start. Every write and every
// CheckFile() compares the file at `path` with the one open; on a mismatch the store logs it,
// reports it through problem(), and writes the open database's whole content (every record and
// event) to a new file at `path`, which it then uses.
//
// Thread-safe: one connection guarded by a mutex (SQLite serialises writers anyway).

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "offloadd/v1/job.pb.h"

struct sqlite3;

namespace offloadd::daemon {

// A ListJobs page holds at most this many bytes of job records (and at least one job): with
// records bounded at CreateJob, a page stays well under gRPC's 4 MiB message limit.
inline constexpr size_t kListPageBytes = 1u << 20;

// A job's metrics history keeps at most this many rows (steps), about 35 MB of database (and of
// the history a restarted executor is handed): far more steps than a fine-tuning job runs. Past it,
// RecordMetrics refuses the steps of new rows with RESOURCE_EXHAUSTED (the job manager says so once
// in the job's events) and ListJobMetrics reports the history as capped; the rows kept stay.
inline constexpr int64_t kMaxMetricRowsPerJob = 500'000;

class JobStore {
 public:
  // Opens (creating if needed) the database at `path`. Errors name the file.
  static StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();

  // ALREADY_EXISTS if the id is taken.
  // Also records job.request_id() when set, as a key of job.submitted_by()'s (FAILED_PRECONDITION
  // when another job of that client holds it): request ids are per client.
  Status Insert(const offloadd::v1::Job& job);
  // The job `client` created with this CreateJob request_id; NOT_FOUND when none. Keys recorded
  // before request ids were per client are found with an empty `client`.
  StatusOr<std::string> JobForRequest(const std::string& client, const std::string& request_id);
  // NOT_FOUND if the job does not exist.
  Status Update(const offloadd::v1::Job& job);
  // Removes the job's record, events, progress and request id in one transaction; NOT_FOUND when
  // there is no such job.
  Status Delete(const std::string& id);
  StatusOr<offloadd::v1::Job> Get(const std::string& id);

  struct Page {
    std::vector<offloadd::v1::Job> jobs;
    std::string next_page_token;  // empty on the last page
  };
  // Jobs in submission order, `page_size` at most and no more than `max_bytes` of records (but
  // at least one), after `page_token` (from a previous Page), only those in `states` when it is
  // not empty. INVALID_ARGUMENT for a malformed token.
  StatusOr<Page> List(const std::vector<offloadd::v1::JobState>& states, int page_size,
                      const std::string& page_token, size_t max_bytes = kListPageBytes);
  // Jobs in any of `states`, highest priority first, then in submission order.
  StatusOr<std::vector<offloadd::v1::Job>> InStates(const std::vector<offloadd::v1::JobState>& states);
  // The number of jobs in each state that has any (one indexed query, no records read).
  StatusOr<std::map<offloadd::v1::JobState, int64_t>> CountByState();

  // Appends an event, assigning the next cursor of that job (1, 2, ...); returns the cursor.
  StatusOr<int64_t> AppendEvent(offloadd::v1::JobEvent* event);
  // Updates the job's record and appends `event` (to that job's log) in one transaction: a crash
  // of the daemon leaves both or neither, so the record never runs ahead of the event log (a
  // resumed job decides from the log which steps it has reported). Returns the event's cursor.
  StatusOr<int64_t> UpdateAndAppend(const offloadd::v1::Job& job, offloadd::v1::JobEvent* event);
  // Sets the job's progress (and update_time) and appends `event` in one transaction, without
  // writing the job's record. NOT_FOUND when the job does not exist.
  StatusOr<int64_t> SetProgressAndAppend(const std::string& job_id, const offloadd::v1::JobProgress& progress,
                                         offloadd::v1::JobEvent* event);
  // Events with cursor > after_cursor, oldest first, at most `limit`.
  StatusOr<std::vector<offloadd::v1::JobEvent>> Events(const std::string& job_id, int64_t after_cursor,
                                                       int limit);

  // The job's metrics history (job_store_metrics.cc): one row per step, kept with the job and
  // removed with it. RecordMetrics merges `row` into the row of its step: a value the row has
  // already keeps its first report (a step replayed after a resume is not recorded twice), a
  // value it lacks is added (the evaluation that follows a step). A new row past the cap
  // (max_metric_rows) is refused with RESOURCE_EXHAUSTED naming the cap; NOT_FOUND when the job
  // does not exist.
  Status RecordMetrics(const std::string& job_id, const offloadd::v1::StepMetrics& row);
  struct MetricsPage {
    std::vector<offloadd::v1::StepMetrics> rows;
    bool has_more = false;  // rows follow the last of these
    bool capped = false;    // the job holds max_metric_rows rows: later steps were refused
  };
  // Rows with step > *after_step (all when nullopt), in step order, at most `limit`.
  StatusOr<MetricsPage> Metrics(const std::string& job_id, std::optional<int64_t> after_step,
                                int limit);
  // Tests: a smaller cap than kMaxMetricRowsPerJob.
  void set_max_metric_rows(int64_t rows) {
    std::lock_guard<std::mutex> lock(mu_);
    max_metric_rows_ = rows;
  }

  // Compares the file at the database's path with the open one and recreates it when it was
  // deleted or replaced (see above). OK when the file is in place (again).
  Status CheckFile();
  // Why the store cannot keep jobs durable now, empty when it can: the database file is missing
  // and could not be recreated yet, or the last write failed (a full or read-only state
  // directory, an I/O error); cleared by the next successful write.
  std::string problem();
  // How many times the database file was recreated since Open.
  int recreated() {
    std::lock_guard<std::mutex> lock(mu_);
    return recreated_;
  }
  const std::string& path() const { return path_; }

 private:
  JobStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // Opens and sets up the database at `path` (schema, WAL); the caller owns the handle.
  static StatusOr<sqlite3*> OpenDb(const std::string& path);
  static Status ExecOn(sqlite3* db, const std::string& path, const char* sql);
  Status Exec(const char* sql) { return ExecOn(db_, path_, sql); }
  Status Error(const std::string& what);
  // The bodies of Update and AppendEvent; the caller holds mu_.
  Status UpdateLocked(const offloadd::v1::Job& job);
  Status SetProgressLocked(const std::string& job_id, const offloadd::v1::JobProgress& progress,
                           const google::protobuf::Timestamp& update_time);
  StatusOr<int64_t> AppendEventLocked(offloadd::v1::JobEvent* event);
  // Parses a record and the job's progress row (empty: none) into `job`.
  Status ParseJob(const std::string& record, const std::string& progress, offloadd::v1::Job* job);
  // Runs `write` (statements on db_) after CheckFileLocked, and notes its outcome for problem().
  template <typename T, typename F>
  T Write(F write);
  Status CheckFileLocked();
  Status RecreateLocked();
  // The identity of the file at path_ when it was opened (or recreated).
  Status RememberFileLocked();
  // The number of metrics rows of `job_id` (counted once, then followed in metric_rows_).
  StatusOr<int64_t> MetricRowsLocked(const std::string& job_id);

  std::mutex mu_;
  sqlite3* db_;  // null only after a recreation failed to open the new file (retried)
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  std::string file_problem_;   // the file is missing or replaced and not yet recreated
  std::string write_problem_;  // the last write failed
  std::chrono::steady_clock::time_point next_recreate_try_{};
  int recreated_ = 0;
  int64_t max_metric_rows_ = kMaxMetricRowsPerJob;
  std::map<std::string, int64_t> metric_rows_;  // job id -> its metrics rows, once counted
};

}  // namespace offloadd::daemon
