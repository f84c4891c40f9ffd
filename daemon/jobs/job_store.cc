#include "daemon/jobs/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "common/logging.h"
#include "job/executor_protocol.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
constexpr const char* kLog = "jobs";
// A database file that cannot be recreated (a read-only or full state directory) is tried again
// at most this often, not at every write.
constexpr std::chrono::seconds kRecreateRetry{2};

// Finalizes a prepared statement on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() { return stmt_; }
  void Text(int i, const std::string& s) { sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT); }
  void Blob(int i, const std::string& s) { sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT); }
  void Int(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  int Step() { return sqlite3_step(stmt_); }
  std::string ColumnBlob(int i) {
    const void* p = sqlite3_column_blob(stmt_, i);
    if (p == nullptr) return "";  // NULL (a job without a progress row) or empty
    return std::string(static_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, i)));
  }
  int64_t ColumnInt(int i) { return sqlite3_column_int64(stmt_, i); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

std::string StatesClause(const std::vector<v1::JobState>& states, const char* column = "state") {
  if (states.empty()) return "";
  std::string s = std::string(" ") + column + " IN (";
  for (size_t i = 0; i < states.size(); ++i) s += (i ? "," : "") + std::to_string(static_cast<int>(states[i]));
  return s + ")";
}

// The part of a job kept in its progress row: its progress and the time of the last report.
std::string ProgressRow(const v1::JobProgress& progress, const google::protobuf::Timestamp& update_time) {
  v1::Job row;
  *row.mutable_progress() = progress;
  *row.mutable_update_time() = update_time;
  return row.SerializeAsString();
}

bool Later(const google::protobuf::Timestamp& a, const google::protobuf::Timestamp& b) {
  return a.seconds() != b.seconds() ? a.seconds() > b.seconds() : a.nanos() > b.nanos();
}

// Errors of the storage under the database (not of the request): they make problem() non-empty.
bool IsStorageError(const Status& s) {
  return s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kDataLoss ||
         s.code() == StatusCode::kInternal || s.code() == StatusCode::kUnavailable;
}

const Status& StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const StatusOr<T>& s) {
  return s.status();
}

Status SyncFile(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open " + path);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? OkStatus() : ErrnoError(err, "fsync " + path);
}

}  // namespace

StatusOr<sqlite3*> JobStore::OpenDb(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    const std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return UnavailableError("cannot open job database " + path + ": " + msg);
  }
  sqlite3_busy_timeout(db, 5000);
  // WAL: readers never block the writer; synchronous=FULL makes each commit durable (a job's
  // state change must survive a crash of the daemon or the machine).
  for (const char* sql : {
           "PRAGMA journal_mode=WAL",
           "PRAGMA synchronous=FULL",
           "CREATE TABLE IF NOT EXISTS jobs ("
           "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
           "  id TEXT NOT NULL UNIQUE,"
           "  state INTEGER NOT NULL,"
           "  priority INTEGER NOT NULL,"
           "  record BLOB NOT NULL)",
           "CREATE TABLE IF NOT EXISTS events ("
           "  job_id TEXT NOT NULL,"
           "  cursor INTEGER NOT NULL,"
           "  record BLOB NOT NULL,"
           "  PRIMARY KEY (job_id, cursor)) WITHOUT ROWID",
           // CreateJob idempotency keys (request_id -> job id); kept as long as the job is.
           "CREATE TABLE IF NOT EXISTS request_ids ("
           "  request_id TEXT PRIMARY KEY,"
           "  job_id TEXT NOT NULL) WITHOUT ROWID",
           // Each job's progress and last update time (a serialized Job holding only those), apart
           // from its record. Jobs of a database written before it have theirs in the record.
           "CREATE TABLE IF NOT EXISTS progress ("
           "  job_id TEXT PRIMARY KEY,"
           "  record BLOB NOT NULL) WITHOUT ROWID",
           // Each job's metrics history: a serialized StepMetrics per step (job_store_metrics.cc).
           "CREATE TABLE IF NOT EXISTS metrics ("
           "  job_id TEXT NOT NULL,"
           "  step INTEGER NOT NULL,"
           "  record BLOB NOT NULL,"
           "  PRIMARY KEY (job_id, step)) WITHOUT ROWID",
           "CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, priority DESC, seq)",
       }) {
    if (Status s = ExecOn(db, path, sql); !s.ok()) {
      sqlite3_close(db);
      return s;
    }
  }
  return db;
}

StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  ASSIGN_OR_RETURN(sqlite3 * db, OpenDb(path));
  std::unique_ptr<JobStore> store(new JobStore(db, path));
  std::lock_guard<std::mutex> lock(store->mu_);
  RETURN_IF_ERROR(store->RememberFileLocked());
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

Status JobStore::ExecOn(sqlite3* db, const std::string& path, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    const int code = sqlite3_errcode(db);
    const std::string what = "job database " + path + ": " + msg + " (in: " + sql + ")";
    if (code == SQLITE_FULL) return ResourceExhaustedError(what);
    if (code == SQLITE_READONLY || code == SQLITE_CANTOPEN) return UnavailableError(what);
    return InternalError(what);
  }
  return OkStatus();
}

Status JobStore::Error(const std::string& what) {
  const int code = sqlite3_errcode(db_);
  const std::string msg = "job database " + path_ + ": " + what + ": " + sqlite3_errmsg(db_);
  if (code == SQLITE_FULL) return ResourceExhaustedError(msg);
  if (code == SQLITE_IOERR || code == SQLITE_CORRUPT) return DataLossError(msg);
  if (code == SQLITE_READONLY || code == SQLITE_CANTOPEN) return UnavailableError(msg);
  return InternalError(msg);
}

namespace {
// The request_ids key: the client and its request id. A client name has no space (a TCP token
// file's name, an address or "unix:uid=<n>"), so the first space ends it; without a client (keys
// recorded before, and callers that name none) the request id alone.
std::string RequestKey(const std::string& client, const std::string& request_id) {
  return client.empty() ? request_id : client + " " + request_id;
}
}  // namespace

template <typename T, typename F>
T JobStore::Write(F write) {
  // A missing file is logged and reported by the check; the write still goes to the open
  // database (a later recreation copies it), unless there is none.
  (void)CheckFileLocked();
  if (db_ == nullptr) return T(UnavailableError(file_problem_));
  T result = write();
  const Status st = StatusOf(result);
  if (st.ok()) {
    write_problem_.clear();
  } else if (IsStorageError(st)) {
    write_problem_ = st.message();
  }
  return result;
}

std::string JobStore::problem() {
  std::lock_guard<std::mutex> lock(mu_);
  return !file_problem_.empty() ? file_problem_ : write_problem_;
}

namespace {
// SQLite's in-memory database (":memory:", the fuzz harness's) has no file to watch.
bool IsInMemory(const std::string& path) { return path == ":memory:"; }
}  // namespace

Status JobStore::RememberFileLocked() {
  if (IsInMemory(path_)) return OkStatus();
  struct stat st{};
  if (::stat(path_.c_str(), &st) != 0) return ErrnoError(errno, "job database " + path_);
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  return OkStatus();
}

Status JobStore::CheckFile() {
  std::lock_guard<std::mutex> lock(mu_);
  return CheckFileLocked();
}

Status JobStore::CheckFileLocked() {
  if (IsInMemory(path_)) {
    return db_ != nullptr ? OkStatus() : UnavailableError("job database :memory: is not open");
  }
  struct stat st{};
  const int rc = ::stat(path_.c_str(), &st);
  const int err = rc == 0 ? 0 : errno;
  if (rc == 0 && st.st_dev == dev_ && st.st_ino == ino_ && db_ != nullptr) return OkStatus();
  if (rc != 0 && err != ENOENT) {
    // Not known to be gone (EACCES, EIO): say so, but do not write a new file over it.
    file_problem_ = "job database " + path_ + " cannot be checked: " + ErrnoError(err, "stat").message();
    return UnavailableError(file_problem_);
  }
  const auto now = std::chrono::steady_clock::now();
  if (file_problem_.empty()) {
    file_problem_ = "job database " + path_ +
                    (db_ == nullptr ? std::string(" is not open")
                     : rc != 0      ? std::string(" was deleted while the daemon ran")
                                    : std::string(" was replaced by another file while the daemon ran")) +
                    "; jobs are not durable until it is recreated";
    OFFLOADD_LOG(kError, kLog) << file_problem_ << ": recreating it from the open database (every job "
                               << "and event); health is NOT_SERVING meanwhile";
  } else if (now < next_recreate_try_) {
    return UnavailableError(file_problem_);
  }
  if (Status s = RecreateLocked(); !s.ok()) {
    next_recreate_try_ = now + kRecreateRetry;
    file_problem_ = "job database " + path_ + " is missing and cannot be recreated (" + s.message() +
                    "); jobs are not durable until it is. Retrying every " + std::to_string(kRecreateRetry.count()) +
                    " s";
    OFFLOADD_LOG(kError, kLog) << file_problem_;
    return UnavailableError(file_problem_);
  }
  file_problem_.clear();
  ++recreated_;
  OFFLOADD_LOG(kWarning, kLog) << "job database " << path_ << " recreated from the open database; jobs are "
                               << "durable again";
  return OkStatus();
}

Status JobStore::RecreateLocked() {
  if (db_ != nullptr) {
    // The open connection still reads the unlinked file (and its WAL): copy all of it into a new
    // file, then put that in place atomically.
    const std::string tmp = path_ + ".recreate." + std::to_string(::getpid());
    ::unlink(tmp.c_str());
    {
      Stmt v(db_, "VACUUM INTO ?");
      if (!v.ok()) return Error("prepare the copy of the open database");
      v.Text(1, tmp);
      if (v.Step() != SQLITE_DONE) {
        Status s = Error("copy the open database into " + tmp);
        ::unlink(tmp.c_str());
        return s;
      }
    }
    Status synced = SyncFile(tmp, O_RDONLY);
    if (synced.ok() && ::rename(tmp.c_str(), path_.c_str()) != 0) {
      synced = ErrnoError(errno, "rename " + tmp + " to " + path_);
    }
    if (!synced.ok()) {
      ::unlink(tmp.c_str());
      return synced;
    }
    const size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
    if (Status s = SyncFile(dir, O_RDONLY | O_DIRECTORY); !s.ok()) OFFLOADD_LOG(kWarning, kLog) << s.ToString();
    // Closing the old connection removes its -wal and -shm files by name; the new file has none
    // yet. Any left over would be replayed into the new file: remove them first.
    sqlite3_close_v2(db_);
    db_ = nullptr;
    for (const char* suffix : {"-wal", "-shm"}) ::unlink((path_ + suffix).c_str());
  }
  ASSIGN_OR_RETURN(db_, OpenDb(path_));
  return RememberFileLocked();
}

Status JobStore::ParseJob(const std::string& record, const std::string& progress, v1::Job* job) {
  if (!job->ParseFromString(record)) return DataLossError("job database " + path_ + ": corrupt job record");
  if (progress.empty()) return OkStatus();
  v1::Job row;
  if (!row.ParseFromString(progress)) {
    return DataLossError("job database " + path_ + ": corrupt progress of job " + job->id());
  }
  *job->mutable_progress() = row.progress();
  if (Later(row.update_time(), job->update_time())) *job->mutable_update_time() = row.update_time();
  return OkStatus();
}

StatusOr<std::string> JobStore::JobForRequest(const std::string& client,
                                              const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (db_ == nullptr) return UnavailableError(file_problem_);
  Stmt s(db_, "SELECT job_id FROM request_ids WHERE request_id = ?");
  if (!s.ok()) return Error("prepare request id lookup");
  s.Text(1, RequestKey(client, request_id));
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return NotFoundError("no job for request_id '" + request_id + "'");
  if (rc != SQLITE_ROW) return Error("look up request_id");
  return s.ColumnBlob(0);  // TEXT column: the same bytes
}

Status JobStore::Insert(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  return Write<Status>([&]() -> Status {
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    Status st = [&]() -> Status {
      if (!job.request_id().empty()) {
        // The key goes in first: a key already taken refuses the insert before the job exists.
        Stmt k(db_, "INSERT INTO request_ids (request_id, job_id) VALUES (?, ?)");
        if (!k.ok()) return Error("prepare request id insert");
        k.Text(1, RequestKey(job.submitted_by(), job.request_id()));
        k.Text(2, job.id());
        const int rc = k.Step();
        if (rc == SQLITE_CONSTRAINT) return FailedPreconditionError("request_id '" + job.request_id() + "' is taken");
        if (rc != SQLITE_DONE) return Error("insert request id for job " + job.id());
      }
      v1::Job record = job;
      record.clear_progress();
      Stmt s(db_, "INSERT INTO jobs (id, state, priority, record) VALUES (?, ?, ?, ?)");
      if (!s.ok()) return Error("prepare insert");
      s.Text(1, job.id());
      s.Int(2, job.state());
      s.Int(3, job.spec().priority());
      s.Blob(4, record.SerializeAsString());
      const int rc = s.Step();
      if (rc == SQLITE_CONSTRAINT) return AlreadyExistsError("job " + job.id() + " already exists");
      if (rc != SQLITE_DONE) return Error("insert job " + job.id());
      if (job.has_progress()) return SetProgressLocked(job.id(), job.progress(), job.update_time());
      return OkStatus();
    }();
    if (st.ok()) st = Exec("COMMIT");
    if (!st.ok()) (void)Exec("ROLLBACK");  // may find no transaction (a failed COMMIT rolled back)
    return st;
  });
}

Status JobStore::Update(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  return Write<Status>([&] {
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    Status st = UpdateLocked(job);
    if (st.ok()) st = Exec("COMMIT");
    if (!st.ok()) (void)Exec("ROLLBACK");
    return st;
  });
}

Status JobStore::Delete(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return Write<Status>([&] {
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    Status st;
    int deleted = 0;
    for (const char* sql :
         {"DELETE FROM jobs WHERE id = ?", "DELETE FROM events WHERE job_id = ?",
          "DELETE FROM progress WHERE job_id = ?", "DELETE FROM request_ids WHERE job_id = ?",
          "DELETE FROM metrics WHERE job_id = ?"}) {
      Stmt s(db_, sql);
      if (!s.ok()) {
        st = Error("prepare delete");
        break;
      }
      s.Text(1, id);
      if (s.Step() != SQLITE_DONE) {
        st = Error("delete job " + id);
        break;
      }
      if (deleted == 0) deleted = sqlite3_changes(db_) > 0 ? 1 : -1;  // the jobs row
    }
    if (st.ok() && deleted < 0) st = NotFoundError("job " + id + " not found");
    if (st.ok()) st = Exec("COMMIT");
    if (!st.ok()) (void)Exec("ROLLBACK");
    metric_rows_.erase(id);  // counted again when needed
    return st;
  });
}

Status JobStore::UpdateLocked(const v1::Job& job) {
  v1::Job record = job;
  record.clear_progress();
  Stmt s(db_, "UPDATE jobs SET state = ?, priority = ?, record = ? WHERE id = ?");
  if (!s.ok()) return Error("prepare update");
  s.Int(1, job.state());
  s.Int(2, job.spec().priority());
  s.Blob(3, record.SerializeAsString());
  s.Text(4, job.id());
  if (s.Step() != SQLITE_DONE) return Error("update job " + job.id());
  if (sqlite3_changes(db_) == 0) return NotFoundError("job " + job.id() + " does not exist");
  // A record read with its progress keeps it (a database written before the progress table has
  // it only in the record): the progress row is small.
  if (job.has_progress()) return SetProgressLocked(job.id(), job.progress(), job.update_time());
  return OkStatus();
}

Status JobStore::SetProgressLocked(const std::string& job_id, const v1::JobProgress& progress,
                                   const google::protobuf::Timestamp& update_time) {
  Stmt s(db_,
         "INSERT INTO progress (job_id, record) VALUES (?, ?) "
         "ON CONFLICT (job_id) DO UPDATE SET record = excluded.record");
  if (!s.ok()) return Error("prepare progress update");
  s.Text(1, job_id);
  s.Blob(2, ProgressRow(progress, update_time));
  if (s.Step() != SQLITE_DONE) return Error("update progress of job " + job_id);
  return OkStatus();
}

StatusOr<v1::Job> JobStore::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (db_ == nullptr) return UnavailableError(file_problem_);
  Stmt s(db_, "SELECT j.record, p.record FROM jobs j LEFT JOIN progress p ON p.job_id = j.id WHERE j.id = ?");
  if (!s.ok()) return Error("prepare get");
  s.Text(1, id);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return NotFoundError("job '" + id + "' does not exist");
  if (rc != SQLITE_ROW) return Error("get job " + id);
  v1::Job job;
  RETURN_IF_ERROR(ParseJob(s.ColumnBlob(0), s.ColumnBlob(1), &job));
  return job;
}

StatusOr<JobStore::Page> JobStore::List(const std::vector<v1::JobState>& states, int page_size,
                                        const std::string& page_token, size_t max_bytes) {
  int64_t after = 0;
  if (!page_token.empty()) {
    char* end = nullptr;
    after = std::strtoll(page_token.c_str(), &end, 10);
    if (end != page_token.c_str() + page_token.size() || after <= 0) {
      return InvalidArgumentError("page_token '" + page_token + "' is not a token from a previous ListJobs");
    }
  }
  std::string where = " WHERE j.seq > ?";
  if (!states.empty()) where += " AND" + StatesClause(states, "j.state");
  const std::string sql =
      "SELECT j.seq, j.record, p.record FROM jobs j LEFT JOIN progress p ON p.job_id = j.id" + where +
      " ORDER BY j.seq LIMIT ?";
  std::lock_guard<std::mutex> lock(mu_);
  if (db_ == nullptr) return UnavailableError(file_problem_);
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return Error("prepare list");
  s.Int(1, after);
  s.Int(2, page_size + 1);  // one more tells whether there is a next page
  Page page;
  int64_t last_seq = 0;
  size_t bytes = 0;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    v1::Job job;
    RETURN_IF_ERROR(ParseJob(s.ColumnBlob(1), s.ColumnBlob(2), &job));
    const size_t size = job.ByteSizeLong();
    // Full by count or by bytes: the rest on the next page (a page holds at least one job).
    if (static_cast<int>(page.jobs.size()) == page_size || (!page.jobs.empty() && bytes + size > max_bytes)) {
      page.next_page_token = std::to_string(last_seq);
      break;
    }
    last_seq = s.ColumnInt(0);
    bytes += size;
    page.jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("list jobs");
  return page;
}

StatusOr<std::vector<v1::Job>> JobStore::InStates(const std::vector<v1::JobState>& states) {
  const std::string sql = "SELECT j.record, p.record FROM jobs j LEFT JOIN progress p ON p.job_id = j.id WHERE" +
                          StatesClause(states, "j.state") + " ORDER BY j.priority DESC, j.seq";
  std::lock_guard<std::mutex> lock(mu_);
  if (db_ == nullptr) return UnavailableError(file_problem_);
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return Error("prepare select by state");
  std::vector<v1::Job> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    v1::Job job;
    RETURN_IF_ERROR(ParseJob(s.ColumnBlob(0), s.ColumnBlob(1), &job));
    out.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return Error("select jobs by state");
  return out;
}

StatusOr<std::map<v1::JobState, int64_t>> JobStore::CountByState() {
  std::lock_guard<std::mutex> lock(mu_);
  if (db_ == nullptr) return UnavailableError(file_problem_);
  Stmt s(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
  if (!s.ok()) return Error("prepare count by state");
  std::map<v1::JobState, int64_t> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    const int64_t state = s.ColumnInt(0);
    if (!v1::JobState_IsValid(static_cast<int>(state))) {
      return DataLossError("job database " + path_ + ": unknown job state " + std::to_string(state));
    }
    out[static_cast<v1::JobState>(state)] = s.ColumnInt(1);
  }
  if (rc != SQLITE_DONE) return Error("count jobs by state");
  return out;
}

StatusOr<int64_t> JobStore::AppendEvent(v1::JobEvent* event) {
  std::lock_guard<std::mutex> lock(mu_);
  return Write<StatusOr<int64_t>>([&] { return AppendEventLocked(event); });
}

StatusOr<int64_t> JobStore::UpdateAndAppend(const v1::Job& job, v1::JobEvent* event) {
  if (event->job_id() != job.id()) {
    return InvalidArgumentError("event of job '" + event->job_id() + "' given with the record of job " + job.id());
  }
  std::lock_guard<std::mutex> lock(mu_);
  return Write<StatusOr<int64_t>>([&]() -> StatusOr<int64_t> {
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    Status st = UpdateLocked(job);
    StatusOr<int64_t> cursor = st.ok() ? AppendEventLocked(event) : StatusOr<int64_t>(st);
    if (cursor.ok()) {
      st = Exec("COMMIT");
      if (st.ok()) return cursor;
      cursor = st;
    }
    // A failed COMMIT may already have rolled back (SQLITE_FULL, SQLITE_IOERR); then this one
    // fails with "no transaction is active", which changes nothing.
    (void)Exec("ROLLBACK");
    return cursor;
  });
}

StatusOr<int64_t> JobStore::SetProgressAndAppend(const std::string& job_id, const v1::JobProgress& progress,
                                                 v1::JobEvent* event) {
  if (event->job_id() != job_id) {
    return InvalidArgumentError("event of job '" + event->job_id() + "' given with the progress of job " + job_id);
  }
  std::lock_guard<std::mutex> lock(mu_);
  return Write<StatusOr<int64_t>>([&]() -> StatusOr<int64_t> {
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    StatusOr<int64_t> cursor = [&]() -> StatusOr<int64_t> {
      Stmt exists(db_, "SELECT 1 FROM jobs WHERE id = ?");
      if (!exists.ok()) return Error("prepare job lookup");
      exists.Text(1, job_id);
      const int rc = exists.Step();
      if (rc == SQLITE_DONE) return NotFoundError("job " + job_id + " does not exist");
      if (rc != SQLITE_ROW) return Error("look up job " + job_id);
      RETURN_IF_ERROR(SetProgressLocked(job_id, progress, event->time()));
      return AppendEventLocked(event);
    }();
    if (cursor.ok()) {
      const Status st = Exec("COMMIT");
      if (st.ok()) return cursor;
      cursor = st;
    }
    (void)Exec("ROLLBACK");
    return cursor;
  });
}

StatusOr<int64_t> JobStore::AppendEventLocked(v1::JobEvent* event) {
  Stmt next(db_, "SELECT COALESCE(MAX(cursor), 0) + 1 FROM events WHERE job_id = ?");
  if (!next.ok()) return Error("prepare cursor");
  next.Text(1, event->job_id());
  if (next.Step() != SQLITE_ROW) return Error("next cursor");
  event->set_cursor(next.ColumnInt(0));
  Stmt s(db_, "INSERT INTO events (job_id, cursor, record) VALUES (?, ?, ?)");
  if (!s.ok()) return Error("prepare append");
  s.Text(1, event->job_id());
  s.Int(2, event->cursor());
  s.Blob(3, event->SerializeAsString());
  if (s.Step() != SQLITE_DONE) return Error("append event to job " + event->job_id());
  return event->cursor();
}

StatusOr<std::vector<v1::JobEvent>> JobStore::Events(const std::string& job_id, int64_t after_cursor, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (db_ == nullptr) return UnavailableError(file_problem_);
  Stmt s(db_, "SELECT record FROM events WHERE job_id = ? AND cursor > ? ORDER BY cursor LIMIT ?");
  if (!s.ok()) return Error("prepare events");
  s.Text(1, job_id);
  s.Int(2, after_cursor);
  s.Int(3, limit);
  std::vector<v1::JobEvent> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    v1::JobEvent e;
    if (!e.ParseFromString(s.ColumnBlob(0))) return DataLossError("job database " + path_ + ": corrupt event");
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return Error("read events of job " + job_id);
  return out;
}

StatusOr<int64_t> JobStore::MetricRowsLocked(const std::string& job_id) {
  if (auto it = metric_rows_.find(job_id); it != metric_rows_.end()) return it->second;
  Stmt s(db_, "SELECT COUNT(*) FROM metrics WHERE job_id = ?");
  if (!s.ok()) return Error("prepare metrics count");
  s.Text(1, job_id);
  if (s.Step() != SQLITE_ROW) return Error("count the metrics of job " + job_id);
  const int64_t rows = s.ColumnInt(0);
  metric_rows_[job_id] = rows;
  return rows;
}

Status JobStore::RecordMetrics(const std::string& job_id, const v1::StepMetrics& row) {
  if (row.step() < 0) {
    return InvalidArgumentError("metrics of job " + job_id + ": step " +
                                std::to_string(row.step()) + " is negative");
  }
  std::lock_guard<std::mutex> lock(mu_);
  return Write<Status>([&]() -> Status {
    RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    bool inserted = false;
    Status st = [&]() -> Status {
      Stmt exists(db_, "SELECT 1 FROM jobs WHERE id = ?");
      if (!exists.ok()) return Error("prepare job lookup");
      exists.Text(1, job_id);
      const int found = exists.Step();
      if (found == SQLITE_DONE) return NotFoundError("job " + job_id + " does not exist");
      if (found != SQLITE_ROW) return Error("look up job " + job_id);
      Stmt get(db_, "SELECT record FROM metrics WHERE job_id = ? AND step = ?");
      if (!get.ok()) return Error("prepare metrics lookup");
      get.Text(1, job_id);
      get.Int(2, row.step());
      const int rc = get.Step();
      if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("read the metrics of job " + job_id);
      v1::StepMetrics merged;
      if (rc == SQLITE_ROW) {
        if (!merged.ParseFromString(get.ColumnBlob(0))) {
          return DataLossError("job database " + path_ + ": corrupt metrics of job " + job_id +
                               " at step " + std::to_string(row.step()));
        }
        if (!MergeStepMetrics(row, &merged)) return OkStatus();  // nothing new: a replayed step
      } else {
        ASSIGN_OR_RETURN(const int64_t rows, MetricRowsLocked(job_id));
        if (rows >= max_metric_rows_) {
          return ResourceExhaustedError(
              "job " + job_id + " keeps at most " + std::to_string(max_metric_rows_) +
              " steps of metrics history; step " + std::to_string(row.step()) +
              " and later ones are not recorded");
        }
        merged = row;
        inserted = true;
      }
      Stmt put(db_,
               "INSERT INTO metrics (job_id, step, record) VALUES (?, ?, ?) "
               "ON CONFLICT (job_id, step) DO UPDATE SET record = excluded.record");
      if (!put.ok()) return Error("prepare metrics write");
      put.Text(1, job_id);
      put.Int(2, row.step());
      put.Blob(3, merged.SerializeAsString());
      if (put.Step() != SQLITE_DONE) return Error("record the metrics of job " + job_id);
      return OkStatus();
    }();
    if (st.ok()) st = Exec("COMMIT");
    if (!st.ok()) {
      (void)Exec("ROLLBACK");
    } else if (inserted) {
      ++metric_rows_[job_id];
    }
    return st;
  });
}

StatusOr<JobStore::MetricsPage> JobStore::Metrics(const std::string& job_id,
                                                  std::optional<int64_t> after_step, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (db_ == nullptr) return UnavailableError(file_problem_);
  Stmt s(db_, "SELECT record FROM metrics WHERE job_id = ? AND step > ? ORDER BY step LIMIT ?");
  if (!s.ok()) return Error("prepare metrics");
  s.Text(1, job_id);
  s.Int(2, after_step ? *after_step : std::numeric_limits<int64_t>::min());
  s.Int(3, static_cast<int64_t>(limit) + 1);  // one more tells whether more follow
  MetricsPage page;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    if (static_cast<int>(page.rows.size()) == limit) {
      page.has_more = true;
      break;
    }
    v1::StepMetrics m;
    if (!m.ParseFromString(s.ColumnBlob(0))) {
      return DataLossError("job database " + path_ + ": corrupt metrics of job " + job_id);
    }
    page.rows.push_back(std::move(m));
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("read the metrics of job " + job_id);
  ASSIGN_OR_RETURN(const int64_t rows, MetricRowsLocked(job_id));
  page.capped = rows >= max_metric_rows_;
  return page;
}

}  // namespace offloadd::daemon
