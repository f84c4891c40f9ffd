#include "daemon/jobs/job_store.h"

#include <sqlite3.h>

#include <string_view>

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;

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
    return std::string(static_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, i)));
  }
  int64_t ColumnInt(int i) { return sqlite3_column_int64(stmt_, i); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

std::string StatesClause(const std::vector<v1::JobState>& states) {
  if (states.empty()) return "";
  std::string s = " state IN (";
  for (size_t i = 0; i < states.size(); ++i) s += (i ? "," : "") + std::to_string(static_cast<int>(states[i]));
  return s + ")";
}

}  // namespace

StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    const std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return UnavailableError("cannot open job database " + path + ": " + msg);
  }
  std::unique_ptr<JobStore> store(new JobStore(db, path));
  sqlite3_busy_timeout(db, 5000);
  // WAL: readers never block the writer; synchronous=FULL makes each commit durable (a job's
  // state change must survive a crash of the daemon or the machine).
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL"));
  RETURN_IF_ERROR(store->Exec(
      "CREATE TABLE IF NOT EXISTS jobs ("
      "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
      "  id TEXT NOT NULL UNIQUE,"
      "  state INTEGER NOT NULL,"
      "  priority INTEGER NOT NULL,"
      "  record BLOB NOT NULL)"));
  RETURN_IF_ERROR(store->Exec(
      "CREATE TABLE IF NOT EXISTS events ("
      "  job_id TEXT NOT NULL,"
      "  cursor INTEGER NOT NULL,"
      "  record BLOB NOT NULL,"
      "  PRIMARY KEY (job_id, cursor)) WITHOUT ROWID"));
  // CreateJob idempotency keys (request_id -> job id); kept as long as the job is.
  RETURN_IF_ERROR(store->Exec(
      "CREATE TABLE IF NOT EXISTS request_ids ("
      "  request_id TEXT PRIMARY KEY,"
      "  job_id TEXT NOT NULL) WITHOUT ROWID"));
  RETURN_IF_ERROR(store->Exec("CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, priority DESC, seq)"));
  return store;
}

JobStore::~JobStore() { sqlite3_close(db_); }

Status JobStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return InternalError("job database " + path_ + ": " + msg + " (in: " + sql + ")");
  }
  return OkStatus();
}

Status JobStore::Error(const std::string& what) {
  const int code = sqlite3_errcode(db_);
  const std::string msg = "job database " + path_ + ": " + what + ": " + sqlite3_errmsg(db_);
  if (code == SQLITE_FULL) return ResourceExhaustedError(msg);
  if (code == SQLITE_IOERR || code == SQLITE_CORRUPT) return DataLossError(msg);
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

StatusOr<std::string> JobStore::JobForRequest(const std::string& client,
                                              const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
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
  Stmt s(db_, "INSERT INTO jobs (id, state, priority, record) VALUES (?, ?, ?, ?)");
  if (!s.ok()) return Error("prepare insert");
  s.Text(1, job.id());
  s.Int(2, job.state());
  s.Int(3, job.spec().priority());
  s.Blob(4, job.SerializeAsString());
  const int rc = s.Step();
  if (rc != SQLITE_DONE && !job.request_id().empty()) {
    Stmt undo(db_, "DELETE FROM request_ids WHERE request_id = ?");
    if (undo.ok()) {
      undo.Text(1, RequestKey(job.submitted_by(), job.request_id()));
      undo.Step();
    }
  }
  if (rc == SQLITE_CONSTRAINT) return AlreadyExistsError("job " + job.id() + " already exists");
  if (rc != SQLITE_DONE) return Error("insert job " + job.id());
  return OkStatus();
}

Status JobStore::Update(const v1::Job& job) {
  std::lock_guard<std::mutex> lock(mu_);
  return UpdateLocked(job);
}

Status JobStore::UpdateLocked(const v1::Job& job) {
  Stmt s(db_, "UPDATE jobs SET state = ?, priority = ?, record = ? WHERE id = ?");
  if (!s.ok()) return Error("prepare update");
  s.Int(1, job.state());
  s.Int(2, job.spec().priority());
  s.Blob(3, job.SerializeAsString());
  s.Text(4, job.id());
  if (s.Step() != SQLITE_DONE) return Error("update job " + job.id());
  if (sqlite3_changes(db_) == 0) return NotFoundError("job " + job.id() + " does not exist");
  return OkStatus();
}

StatusOr<v1::Job> JobStore::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, "SELECT record FROM jobs WHERE id = ?");
  if (!s.ok()) return Error("prepare get");
  s.Text(1, id);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return NotFoundError("job '" + id + "' does not exist");
  if (rc != SQLITE_ROW) return Error("get job " + id);
  v1::Job job;
  if (!job.ParseFromString(s.ColumnBlob(0))) return DataLossError("job database " + path_ + ": record of job " + id + " is corrupt");
  return job;
}

StatusOr<JobStore::Page> JobStore::List(const std::vector<v1::JobState>& states, int page_size,
                                        const std::string& page_token) {
  int64_t after = 0;
  if (!page_token.empty()) {
    char* end = nullptr;
    after = std::strtoll(page_token.c_str(), &end, 10);
    if (end != page_token.c_str() + page_token.size() || after <= 0) {
      return InvalidArgumentError("page_token '" + page_token + "' is not a token from a previous ListJobs");
    }
  }
  std::string where = " WHERE seq > ?";
  if (!states.empty()) where += " AND" + StatesClause(states);
  const std::string sql = "SELECT seq, record FROM jobs" + where + " ORDER BY seq LIMIT ?";
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return Error("prepare list");
  s.Int(1, after);
  s.Int(2, page_size + 1);  // one more tells whether there is a next page
  Page page;
  int64_t last_seq = 0;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    if (static_cast<int>(page.jobs.size()) == page_size) {
      page.next_page_token = std::to_string(last_seq);
      break;
    }
    last_seq = s.ColumnInt(0);
    v1::Job job;
    if (!job.ParseFromString(s.ColumnBlob(1))) return DataLossError("job database " + path_ + ": corrupt job record");
    page.jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("list jobs");
  return page;
}

StatusOr<std::vector<v1::Job>> JobStore::InStates(const std::vector<v1::JobState>& states) {
  const std::string sql = "SELECT record FROM jobs WHERE" + StatesClause(states) + " ORDER BY priority DESC, seq";
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_, sql.c_str());
  if (!s.ok()) return Error("prepare select by state");
  std::vector<v1::Job> out;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    v1::Job job;
    if (!job.ParseFromString(s.ColumnBlob(0))) return DataLossError("job database " + path_ + ": corrupt job record");
    out.push_back(std::move(job));
  }
  if (rc != SQLITE_DONE) return Error("select jobs by state");
  return out;
}

StatusOr<std::map<v1::JobState, int64_t>> JobStore::CountByState() {
  std::lock_guard<std::mutex> lock(mu_);
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
  return AppendEventLocked(event);
}

StatusOr<int64_t> JobStore::UpdateAndAppend(const v1::Job& job, v1::JobEvent* event) {
  if (event->job_id() != job.id()) {
    return InvalidArgumentError("event of job '" + event->job_id() + "' given with the record of job " + job.id());
  }
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  Status st = UpdateLocked(job);
  StatusOr<int64_t> cursor = st.ok() ? AppendEventLocked(event) : StatusOr<int64_t>(st);
  if (cursor.ok()) {
    st = Exec("COMMIT");
    if (st.ok()) return cursor;
    cursor = st;
  }
  // A failed COMMIT may already have rolled back (SQLITE_FULL, SQLITE_IOERR); then this one fails
  // with "no transaction is active", which changes nothing.
  (void)Exec("ROLLBACK");
  return cursor;
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

}  // namespace offloadd::daemon
