#include "daemon/openai/openai_api.h"

#include <openssl/crypto.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>

#include "common/file.h"
#include "common/logging.h"
#include "common/message_text.h"
#include "daemon/openai/file_store.h"
#include "daemon/openai/http_server.h"
#include "daemon/openai/multipart.h"
#include "daemon/openai/openai_jobs.h"
#include "daemon/server/client_quota.h"
#include "daemon/server/token_auth.h"
#include "job/path_policy.h"

namespace offloadd::daemon::openai {
namespace {

using nlohmann::json;
namespace v1 = offloadd::v1;

constexpr const char* kLog = "openai-api";
// The client of a bare token (no names in the token file): an operator.
constexpr const char* kBareTokenClient = "openai-api";
constexpr int kMaxPage = 100;
constexpr int kValidationWaitSeconds = 120;
constexpr int kHandlerThreads = 16;

HttpResponse Json(const json& j, int status = 200) {
  return {status, j.dump(-1, ' ', false, json::error_handler_t::replace)};
}

HttpResponse Error(const ApiError& e) { return {e.status, ErrorBody(e)}; }

std::string PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i] == '+' ? ' ' : s[i];
    }
  }
  return out;
}

struct Target {
  std::vector<std::string> path;  // "/v1/files/x" -> {"v1", "files", "x"}
  std::map<std::string, std::string> query;
};

Target ParseTarget(const std::string& target) {
  Target t;
  const size_t q = target.find('?');
  const std::string path = target.substr(0, q);
  for (size_t pos = 1; pos <= path.size();) {
    const size_t slash = std::min(path.find('/', pos), path.size());
    if (slash > pos)
      t.path.push_back(PercentDecode(std::string_view(path).substr(pos, slash - pos)));
    pos = slash + 1;
  }
  if (q != std::string::npos) {
    std::string_view rest = std::string_view(target).substr(q + 1);
    while (!rest.empty()) {
      const size_t amp = std::min(rest.find('&'), rest.size());
      const std::string_view kv = rest.substr(0, amp);
      const size_t eq = kv.find('=');
      t.query[PercentDecode(kv.substr(0, eq))] =
          eq == std::string_view::npos ? "" : PercentDecode(kv.substr(eq + 1));
      rest = amp < rest.size() ? rest.substr(amp + 1) : std::string_view();
    }
  }
  return t;
}

// `limit` of a list call: 1 to 100, 20 when absent.
StatusOr<int> Limit(const Target& t) {
  const auto it = t.query.find("limit");
  if (it == t.query.end()) return 20;
  char* end = nullptr;
  const long v = std::strtol(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || v < 1 || v > kMaxPage) {
    return InvalidArgumentError("limit must be an integer in [1, 100], got '" +
                                SafeMessageText(it->second, 64) + "'");
  }
  return static_cast<int>(v);
}

std::string Query(const Target& t, const char* key) {
  const auto it = t.query.find(key);
  return it == t.query.end() ? "" : it->second;
}

json FileJson(const StoredFile& f) {
  return {{"id", f.id},
          {"object", "file"},
          {"bytes", f.bytes},
          {"created_at", f.created_at},
          {"filename", f.filename},
          {"purpose", f.purpose},
          {"status", "processed"},
          {"status_details", nullptr},
          {"expires_at", nullptr}};
}

json Page(json data, bool has_more) {
  json j = {{"object", "list"}, {"data", std::move(data)}, {"has_more", has_more}};
  if (!j["data"].empty()) {
    j["first_id"] = j["data"].front()["id"];
    j["last_id"] = j["data"].back()["id"];
  }
  return j;
}

// A list newest first, `limit` at most, of the items before `after` (older than it), from a
// source read oldest first: the last `limit` items before `after` are kept as it is read.
template <typename T>
struct NewestFirst {
  explicit NewestFirst(int max_items) : limit(max_items) {}
  int limit;
  std::deque<T> kept;
  bool dropped = false;
  void Add(T item) {
    kept.push_back(std::move(item));
    if (static_cast<int>(kept.size()) > limit) {
      kept.pop_front();
      dropped = true;
    }
  }
};

// The server's per-client job limit; validations as CreateJob's (4 at once, 2 per client). A
// create holds a handler thread while it waits for a slot and validates: creates hold at most half
// of the threads, one client's at most a quarter, so that the other calls are served.
ClientQuotaLimits ApiQuotaLimits(const DaemonConfig& c) {
  ClientQuotaLimits l =
      QuotaLimitsFor(c.server.max_active_jobs_per_client, c.server.max_watchers_per_client,
                     c.server.max_threads, c.server.reserved_threads);
  l.max_held_calls = kHandlerThreads / 2;
  l.max_held_calls_per_client = kHandlerThreads / 4;
  l.max_creates_per_client = kHandlerThreads / 4;
  l.validation_slots = 4;
  l.validation_slots_per_client = 2;
  return l;
}

class ActiveJobQuota : public SubmitQuota {
 public:
  ActiveJobQuota(ClientQuota& quota, std::string client, JobManager& jobs)
      : quota_(quota), client_(std::move(client)), jobs_(jobs) {}
  Status Reserve() override {
    return quota_.Reserve(client_, [this](const std::string& id) {
      auto j = jobs_.Get(id);
      return j.ok() && (j->state() == v1::JOB_STATE_QUEUED || j->state() == v1::JOB_STATE_RUNNING ||
                        j->state() == v1::JOB_STATE_PAUSING || j->state() == v1::JOB_STATE_PAUSED);
    });
  }
  void Commit(const std::string& job_id) override { quota_.Commit(client_, job_id); }
  void Release() override { quota_.Release(client_); }

 private:
  ClientQuota& quota_;
  const std::string client_;
  JobManager& jobs_;
};

}  // namespace

struct OpenAiApi::Impl {
  DaemonConfig config;
  JobManager* jobs;
  std::vector<ClientToken> tokens;
  std::unique_ptr<FileStore> files;
  ClientQuota quota;
  JobRequestContext context;
  std::unique_ptr<HttpServer> server;

  Impl(const DaemonConfig& c, JobManager* j) : config(c), jobs(j), quota(ApiQuotaLimits(c)) {}

  // On a Unix socket the caller is the local user it runs as, as on the gRPC socket (the socket's
  // mode is what grants access, docs/security.md section 3); an Authorization header there is not
  // looked at (the openai package sends its api_key whatever it is). On TCP every token is
  // compared, in constant time per token (docs/security.md, section 2).
  StatusOr<std::string> Authenticate(const std::string& authorization, const HttpPeer& peer) const {
    if (peer.unix_socket) return "unix:uid=" + std::to_string(peer.uid);
    if (authorization.empty()) {
      return Status(StatusCode::kUnauthenticated,
                    "no API key: send the header 'Authorization: Bearer <token>' (a token of "
                    "server.openai_api.auth_token_file)");
    }
    const ClientToken* found = nullptr;
    for (const ClientToken& t : tokens) {
      const std::string want = "Bearer " + t.token;
      if (want.size() == authorization.size() &&
          CRYPTO_memcmp(want.data(), authorization.data(), want.size()) == 0) {
        found = &t;
      }
    }
    if (found == nullptr) return Status(StatusCode::kUnauthenticated, "invalid bearer token");
    return found->name.empty() ? std::string(kBareTokenClient) : "token:" + found->name;
  }

  const ClientToken* TokenOf(const std::string& client) const {
    for (const ClientToken& t : tokens) {
      if ((t.name.empty() && client == kBareTokenClient) || client == "token:" + t.name) return &t;
    }
    return nullptr;
  }

  StatusOr<std::optional<FileIdentity>> IdentityOf(const std::string& client) const {
    const ClientToken* t = TokenOf(client);
    std::map<std::string, std::string> users;
    if (t != nullptr && !t->name.empty()) users[t->name] = t->user;
    return SubmitterFileIdentity(client, users);
  }

  HttpResponse Handle(const HttpRequest& r) {
    const Target t = ParseTarget(r.target);
    const auto& p = t.path;
    const bool get = r.method == "GET", post = r.method == "POST";
    if (p.size() >= 2 && p[0] == "v1" && p[1] == "files") {
      if (p.size() == 2 && post) return CreateFile(r);
      if (p.size() == 2 && get) return ListFiles(t);
      if (p.size() == 3 && get) return GetFile(p[2]);
    }
    if (p.size() >= 3 && p[0] == "v1" && p[1] == "fine_tuning" && p[2] == "jobs") {
      if (p.size() == 3 && post) return CreateJob(r);
      if (p.size() == 3 && get) return ListJobs(t);
      if (p.size() == 4 && get) return GetJob(p[3]);
      if (p.size() == 5 && post && (p[4] == "cancel" || p[4] == "pause" || p[4] == "resume")) {
        return Control(r.client, p[3], p[4]);
      }
      if (p.size() == 5 && get && p[4] == "events") return ListEvents(p[3], t);
      if (p.size() == 5 && get && p[4] == "checkpoints") return ListCheckpoints(p[3], t);
    }
    return Error({404, "no such endpoint: " + r.method + " " + SafeMessageText(r.target, 256), "",
                  "not_found"});
  }

  HttpResponse CreateFile(const HttpRequest& r) {
    auto boundary = MultipartBoundary(r.content_type);
    if (!boundary.ok()) return Error(FromStatus(boundary.status()));
    auto parts = ParseMultipart(r.body, *boundary);
    if (!parts.ok()) return Error(FromStatus(parts.status()));
    const FormPart* file = nullptr;
    std::string purpose;
    for (const FormPart& part : *parts) {
      if (part.name == "file") {
        file = &part;
      } else if (part.name == "purpose") {
        purpose = std::string(part.body);
      } else {
        return Error(
            {400, "unknown parameter '" + SafeMessageText(part.name, 64) + "'", part.name});
      }
    }
    if (purpose != "fine-tune") {
      return Error(
          {400,
           "purpose must be 'fine-tune' (the only purpose offloadd stores files for), got '" +
               SafeMessageText(purpose, 64) + "'",
           "purpose"});
    }
    if (file == nullptr) return Error({400, "the 'file' part is missing", "file"});
    auto identity = IdentityOf(r.client);
    if (!identity.ok()) return Error(FromStatus(identity.status()));
    auto stored = files->Create(SafeMessageText(file->filename, 256), purpose, file->body, r.client,
                                *identity);
    if (!stored.ok()) {
      ApiError e = FromStatus(stored.status(), "file");
      if (stored.status().code() == StatusCode::kInvalidArgument) {
        e.message = "file '" + SafeMessageText(file->filename, 256) +
                    "' is not a fine-tuning file: " + e.message;
        e.code = "invalid_file";
      }
      return Error(e);
    }
    OFFLOADD_LOG(kInfo, kLog) << "file " << stored->id << " (" << stored->records
                              << " records) uploaded by " << r.client;
    return Json(FileJson(*stored));
  }

  HttpResponse GetFile(const std::string& id) {
    auto f = files->Get(id);
    if (!f.ok()) return Error(FromStatus(f.status(), "file_id"));
    return Json(FileJson(*f));
  }

  HttpResponse ListFiles(const Target& t) {
    auto all = files->List();
    if (!all.ok()) return Error(FromStatus(all.status()));
    const std::string purpose = Query(t, "purpose");
    auto limit = t.query.count("limit") ? Limit(t) : StatusOr<int>(10000);
    if (!limit.ok()) return Error(FromStatus(limit.status(), "limit"));
    const std::string after = Query(t, "after");
    json data = json::array();
    bool seen = after.empty(), more = false;
    for (const StoredFile& f : *all) {
      if (!seen) {
        seen = f.id == after;
        continue;
      }
      if (!purpose.empty() && f.purpose != purpose) continue;
      if (static_cast<int>(data.size()) == *limit) {
        more = true;
        break;
      }
      data.push_back(FileJson(f));
    }
    return Json(Page(std::move(data), more));
  }

  HttpResponse CreateJob(const HttpRequest& r) {
    auto spec = SpecFromRequest(r.body, context);
    if (auto* e = std::get_if<ApiError>(&spec)) return Error(*e);
    auto identity = IdentityOf(r.client);
    if (!identity.ok()) return Error(FromStatus(identity.status()));
    SubmitRequest submit;
    submit.spec = std::get<v1::JobSpec>(std::move(spec));
    submit.submitted_by = r.client;
    submit.identity = *identity;
    submit.stop = [] { return false; };
    auto call = quota.AcquireCreate(r.client);
    if (!call.ok()) return Error(FromStatus(call.status()));
    ActiveJobQuota active(quota, r.client, *jobs);
    submit.quota = &active;
    auto slot = quota.AcquireValidation(
        r.client, [] { return false; },
        std::chrono::steady_clock::now() + std::chrono::seconds(kValidationWaitSeconds));
    if (!slot.ok()) return Error(FromStatus(slot.status()));
    auto submitted = jobs->Submit(submit);
    if (!submitted.ok()) return Error(FromStatus(submitted.status()));
    const auto& violations = submitted->validation.violations;
    if (!violations.empty()) {
      std::string message = std::to_string(violations.size()) + " problem" +
                            (violations.size() == 1 ? "" : "s") + " in the job";
      for (size_t i = 0; i < violations.size() && i < 5; ++i) {
        message += (i == 0 ? ": " : "; ") + ParamOfField(violations[i].field) + " (" +
                   violations[i].field + "): " + violations[i].description;
      }
      return Error(
          {400, SafeMessageText(message, 8192), ParamOfField(violations[0].field), "invalid_job"});
    }
    OFFLOADD_LOG(kInfo, kLog) << "job " << submitted->job.id() << " created by " << r.client;
    return Json(JobJson(submitted->job));
  }

  HttpResponse GetJob(const std::string& id) {
    auto job = jobs->Get(id);
    if (!job.ok()) return Error(FromStatus(job.status(), "fine_tuning_job_id"));
    return Json(JobJson(*job));
  }

  HttpResponse ListJobs(const Target& t) {
    auto limit = Limit(t);
    if (!limit.ok()) return Error(FromStatus(limit.status(), "limit"));
    const std::string after = Query(t, "after");
    // Oldest first through the job store's pages, keeping the last `limit` before `after`.
    NewestFirst<v1::Job> page(*limit);
    std::string token;
    bool found = after.empty();
    do {
      auto jobs_page = jobs->List({}, 1000, token);
      if (!jobs_page.ok()) return Error(FromStatus(jobs_page.status()));
      for (v1::Job& j : jobs_page->jobs) {
        if (!after.empty() && j.id() == after) {
          found = true;
          break;
        }
        page.Add(std::move(j));
      }
      token = found && !after.empty() ? "" : jobs_page->next_page_token;
    } while (!token.empty());
    if (!found) return Error({404, "no such job: '" + SafeMessageText(after, 128) + "'", "after"});
    json data = json::array();
    for (auto it = page.kept.rbegin(); it != page.kept.rend(); ++it) data.push_back(JobJson(*it));
    return Json(Page(std::move(data), page.dropped));
  }

  // Who may control any job, as on gRPC: an operator's token; on the Unix socket root and the
  // daemon's own user.
  bool IsOperator(const std::string& client) const {
    if (client == "unix:uid=0" || client == "unix:uid=" + std::to_string(::geteuid())) return true;
    const ClientToken* token = TokenOf(client);
    return token != nullptr && token->is_operator;
  }

  // cancel, pause, resume: the caller's own jobs, or any for an operator.
  HttpResponse Control(const std::string& client, const std::string& id,
                       const std::string& action) {
    auto job = jobs->Get(id);
    if (!job.ok()) return Error(FromStatus(job.status(), "fine_tuning_job_id"));
    if (!IsOperator(client) && job->submitted_by() != client) {
      const bool local = client.rfind("unix:", 0) == 0;
      return Error({403,
                    "job " + id + " was submitted by " +
                        (job->submitted_by().empty() ? std::string("an unrecorded client")
                                                     : job->submitted_by()) +
                        "; " + client + " may not " + action +
                        (local ? " it (only its submitter, root or the daemon's user, uid " +
                                     std::to_string(::geteuid()) + ")"
                               : " it (only its submitter, or a token file line marked "
                                 "'operator')"),
                    "fine_tuning_job_id", "permission_denied"});
    }
    StatusOr<v1::Job> done = action == "cancel"
                                 ? jobs->Cancel(id, "cancelled through the OpenAI API by " + client)
                             : action == "pause" ? jobs->Pause(id)
                                                 : jobs->Resume(id);
    if (!done.ok()) return Error(FromStatus(done.status(), "fine_tuning_job_id"));
    OFFLOADD_LOG(kInfo, kLog) << "job " << id << " " << action << " by " << client;
    return Json(JobJson(*done));
  }

  HttpResponse ListEvents(const std::string& id, const Target& t) {
    auto limit = Limit(t);
    if (!limit.ok()) return Error(FromStatus(limit.status(), "limit"));
    if (auto job = jobs->Get(id); !job.ok())
      return Error(FromStatus(job.status(), "fine_tuning_job_id"));
    int64_t before = INT64_MAX;
    if (const std::string after = Query(t, "after"); !after.empty()) {
      char* end = nullptr;
      before = after.rfind("ftevent-", 0) == 0 ? std::strtoll(after.c_str() + 8, &end, 10) : 0;
      if (before <= 0 || end == nullptr || *end != '\0') {
        return Error({400, "after must be an event id (ftevent-<n>)", "after"});
      }
    }
    NewestFirst<v1::JobEvent> page(*limit);
    int64_t cursor = 0;
    for (;;) {
      bool complete = false;
      auto events = jobs->ReadWatch(id, cursor, 1000, &complete);
      if (!events.ok()) return Error(FromStatus(events.status()));
      bool past = false;
      for (v1::JobEvent& e : *events) {
        if (e.cursor() >= before) {
          past = true;
          break;
        }
        cursor = e.cursor();
        page.Add(std::move(e));
      }
      if (past || events->empty()) break;
    }
    json data = json::array();
    for (auto it = page.kept.rbegin(); it != page.kept.rend(); ++it) data.push_back(EventJson(*it));
    return Json(Page(std::move(data), page.dropped));
  }

  HttpResponse ListCheckpoints(const std::string& id, const Target& t) {
    auto limit = Limit(t);
    if (!limit.ok()) return Error(FromStatus(limit.status(), "limit"));
    auto checkpoints = jobs->Checkpoints(id);
    if (!checkpoints.ok()) return Error(FromStatus(checkpoints.status(), "fine_tuning_job_id"));
    const std::string after = Query(t, "after");
    json data = json::array();
    bool seen = after.empty(), more = false;
    for (auto it = checkpoints->rbegin(); it != checkpoints->rend(); ++it) {
      if (!seen) {
        seen = it->id() == after;
        continue;
      }
      if (static_cast<int>(data.size()) == *limit) {
        more = true;
        break;
      }
      data.push_back(CheckpointJson(*it));
    }
    return Json(Page(std::move(data), more));
  }
};

OpenAiApi::OpenAiApi(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OpenAiApi::~OpenAiApi() { Shutdown(); }

namespace {
bool OnUnixSocket(const OpenAiApiConfig& api) { return api.listen.rfind("unix:", 0) == 0; }
}  // namespace

Status CheckOpenAiApi(const DaemonConfig& config) {
  const OpenAiApiConfig& api = config.server.openai_api;
  if (api.listen.empty()) return OkStatus();
  if (!OnUnixSocket(api)) {
    auto tokens = ReadTokenFile(api.auth_token_file);
    if (!tokens.ok()) return tokens.status().WithContext("server.openai_api.auth_token_file");
  }
  if (!api.tls_cert_file.empty() || !api.tls_key_file.empty()) {
    RETURN_IF_ERROR(CheckTlsFiles(api.tls_cert_file, api.tls_key_file, "server.openai_api."));
  }
  const PathPolicy policy(config.allowed_roots);
  if (auto dir = policy.ResolveForWriting(api.data_dir); !dir.ok()) {
    return InvalidArgumentError("server.openai_api.data_dir " + api.data_dir +
                                " must lie under allowed_roots: the jobs read their files and "
                                "write their models there (" +
                                dir.status().message() + ")");
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<OpenAiApi>> OpenAiApi::Start(const DaemonConfig& config,
                                                      JobManager* jobs) {
  RETURN_IF_ERROR(CheckOpenAiApi(config));
  const OpenAiApiConfig& api = config.server.openai_api;
  auto impl = std::make_unique<Impl>(config, jobs);
  if (!OnUnixSocket(api)) {
    ASSIGN_OR_RETURN(impl->tokens, ReadTokenFile(api.auth_token_file));
  }
  // A daemon running as root opens a job's files with its client's rights (a token's user=): the
  // users must reach their uploads (files/ 0711: by name, not listed; each upload is its
  // uploader's, 0600) and create their models (models/ 01733: like /tmp, but not listed).
  const bool as_root = ::geteuid() == 0;
  auto files = FileStore::Open(api.data_dir + "/files", as_root ? 0711 : 0700);
  if (!files.ok()) return files.status().WithContext("server.openai_api.data_dir");
  impl->files = std::move(*files);
  const std::string models = api.data_dir + "/models";
  if (Status s = MakeDirs(models); !s.ok()) return s.WithContext("server.openai_api.data_dir");
  if (chmod(models.c_str(), as_root ? 01733 : 0700) != 0) {
    return ErrnoError(errno, "cannot set the mode of " + models);
  }
  impl->context.model_dir = api.model_dir;
  impl->context.output_root = api.data_dir + "/models";
  impl->context.base_learning_rate = api.base_learning_rate;
  impl->context.file = [store = impl->files.get()](const std::string& id) {
    return store->Get(id);
  };
  HttpServer::Options options;
  options.listen = api.listen;
  options.unix_socket_mode = config.server.unix_socket_mode;
  options.tls_cert_file = api.tls_cert_file;
  options.tls_key_file = api.tls_key_file;
  options.setting_prefix = "server.openai_api.";
  options.max_body_bytes = api.max_upload_bytes;
  options.handler_threads = kHandlerThreads;
  Impl* self = impl.get();
  options.authenticate = [self](const std::string& authorization, const HttpPeer& peer) {
    return self->Authenticate(authorization, peer);
  };
  options.error = [](int status, const std::string& message, const std::string& code) {
    return Error({status, message, "", code,
                  status == 401 ? "invalid_request_error" : "invalid_request_error"});
  };
  auto server = HttpServer::Start(std::move(options),
                                  [self](const HttpRequest& r) { return self->Handle(r); });
  if (!server.ok()) {
    const std::string m = server.status().message();  // a copy: status() is a temporary
    return m.rfind("server.openai_api.", 0) == 0
               ? server.status()
               : server.status().WithContext("server.openai_api.listen");
  }
  impl->server = std::move(*server);
  return std::unique_ptr<OpenAiApi>(new OpenAiApi(std::move(impl)));
}

int OpenAiApi::port() const { return impl_->server->port(); }

std::string OpenAiApi::url() const {
  const OpenAiApiConfig& api = impl_->config.server.openai_api;
  if (OnUnixSocket(api)) return api.listen + " (base_url http://localhost/v1)";
  return std::string(api.tls_cert_file.empty() ? "http://" : "https://") +
         api.listen.substr(0, api.listen.rfind(':')) + ":" + std::to_string(port()) + "/v1";
}

void OpenAiApi::Shutdown() {
  if (impl_->server) impl_->server->Shutdown();
}

}  // namespace offloadd::daemon::openai
