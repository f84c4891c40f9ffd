#include "daemon/config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/message_text.h"
#include "common/units.h"
#include "daemon/config/cluster_config.h"
#include "daemon/config/yaml_reader.h"
#include "workers/adamw_kernel.h"

namespace offloadd::daemon {
namespace {

constexpr uint64_t kMaxBytes = 1ull << 50;

bool ValidHostPort(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) return false;
  const std::string port = s.substr(colon + 1);
  for (char c : port) {
    if (c < '0' || c > '9') return false;
  }
  return port.size() <= 5 && std::stoul(port) <= 65535;
}

void ReadServer(const YAML::Node& n, const YamlReader& r, ServerConfig* c) {
  if (!r.CheckMap(
          n, {"unix_socket", "unix_socket_mode", "tcp", "max_request_bytes",
              "shutdown_grace_seconds", "max_active_jobs_per_client", "max_watchers_per_client",
              "max_threads", "reserved_threads", "openai_api"})) {
    return;
  }
  r.String(n, "unix_socket", &c->unix_socket);
  r.Mode(n, "unix_socket_mode", &c->unix_socket_mode);
  r.Bytes(n, "max_request_bytes", &c->max_request_bytes, 1024, 1ull << 30);
  r.Double(n, "shutdown_grace_seconds", &c->shutdown_grace_seconds, 0, 3600);
  r.UInt32(n, "max_active_jobs_per_client", &c->max_active_jobs_per_client, 1, 1000000);
  r.UInt32(n, "max_watchers_per_client", &c->max_watchers_per_client, 1, 100000);
  r.UInt32(n, "max_threads", &c->max_threads, 8, 100000);
  r.UInt32(n, "reserved_threads", &c->reserved_threads, 0, 100000);
  if (c->reserved_threads > 0 && c->reserved_threads + 3 > c->max_threads) {
    r.Error("reserved_threads",
            std::to_string(c->reserved_threads) + " leaves fewer than 3 of server.max_threads (" +
                std::to_string(c->max_threads) + ") for CreateJob, WatchJob and gRPC's pollers");
  }
  const YamlReader t = r.Child("tcp");
  const YAML::Node tn = n["tcp"];
  if (t.CheckMap(tn, {"listen", "tls_cert_file", "tls_key_file", "auth_token_file"})) {
    t.String(tn, "listen", &c->tcp.listen);
    t.String(tn, "tls_cert_file", &c->tcp.tls_cert_file);
    t.String(tn, "tls_key_file", &c->tcp.tls_key_file);
    t.String(tn, "auth_token_file", &c->tcp.auth_token_file);
  }
  const YamlReader o = r.Child("openai_api");
  const YAML::Node on = n["openai_api"];
  if (o.CheckMap(on, {"listen", "tls_cert_file", "tls_key_file", "auth_token_file", "data_dir",
                      "model_dir", "max_upload_bytes", "base_learning_rate"})) {
    OpenAiApiConfig& api = c->openai_api;
    o.String(on, "listen", &api.listen);
    o.String(on, "tls_cert_file", &api.tls_cert_file);
    o.String(on, "tls_key_file", &api.tls_key_file);
    o.String(on, "auth_token_file", &api.auth_token_file);
    o.String(on, "data_dir", &api.data_dir);
    o.String(on, "model_dir", &api.model_dir);
    o.Bytes(on, "max_upload_bytes", &api.max_upload_bytes, 1024, 64ull << 30);
    o.Double(on, "base_learning_rate", &api.base_learning_rate, 1e-12, 1);
  }
}

// 127.0.0.0/8, ::1 or localhost: the hosts of the OpenAI API's plaintext listener.
bool LoopbackHost(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

void ReadStorage(const YAML::Node& n, const YamlReader& r, StorageConfig* c) {
  if (!r.CheckMap(n, {"directories", "aio"})) return;
  const YAML::Node dirs = n["directories"];
  if (dirs && !dirs.IsNull()) {
    if (!dirs.IsSequence()) {
      r.Error("directories", "expected a list of {path, weight}");
    } else {
      c->directories.clear();
      for (size_t i = 0; i < dirs.size(); ++i) {
        const YamlReader d = r.Child("directories[" + std::to_string(i) + "]");
        StoreDirectoryConfig dir;
        if (dirs[i].IsScalar()) {
          // The short form (`- /srv/offloadd`) is checked as `path:` is (fuzz regression
          // daemon_config/non-utf8-short-store-directory).
          if (InvalidUtf8At(dirs[i].Scalar()) != std::string_view::npos) {
            r.Error("directories[" + std::to_string(i) + "]", "is not valid UTF-8");
          } else {
            dir.path = dirs[i].Scalar();
          }
        } else if (d.CheckMap(dirs[i], {"path", "weight"})) {
          d.String(dirs[i], "path", &dir.path);
          d.Double(dirs[i], "weight", &dir.weight, 1e-6, 1e6);
        }
        c->directories.push_back(dir);
      }
    }
  }
  const YamlReader a = r.Child("aio");
  const YAML::Node an = n["aio"];
  if (a.CheckMap(an, {"block_size", "queue_depth"})) {
    a.Bytes(an, "block_size", &c->aio.block_size, 4096, 64ull << 20);
    a.UInt32(an, "queue_depth", &c->aio.queue_depth, 1, 4096);
  }
}

void Validate(const DaemonConfig& c, std::vector<std::string>* errors) {
  auto absolute = [&](const std::string& path, const std::string& key) {
    if (!path.empty() && path[0] != '/') errors->push_back(key + ": must be an absolute path, got '" + path + "'");
  };
  absolute(c.state_dir, "state_dir");
  if (auto k = workers::ResolveKernelPath(c.workers.adamw_kernel); !k.ok()) {
    errors->push_back("workers.adamw_kernel: " + k.status().message());
  }
  if (c.state_dir.empty()) errors->push_back("state_dir: must not be empty");
  for (size_t i = 0; i < c.allowed_roots.size(); ++i) {
    absolute(c.allowed_roots[i], "allowed_roots[" + std::to_string(i) + "]");
  }
  absolute(c.server.unix_socket, "server.unix_socket");
  if (c.jobs.wait_for_lost_host_seconds > 0) {
    errors->push_back(
        "jobs.wait_for_lost_host_seconds: waiting for a lost host and resuming is not built; a "
        "lost host fails its job within cluster.lost_host_seconds (leave it 0)");
  }
  ValidateCluster(c.cluster, errors);
  if (c.server.unix_socket.size() > 107) {
    errors->push_back("server.unix_socket: path longer than 107 bytes, the Unix socket limit");
  }
  const TcpConfig& tcp = c.server.tcp;
  if (c.server.unix_socket.empty() && tcp.listen.empty()) {
    errors->push_back("server: neither unix_socket nor tcp.listen is set; the daemon would be unreachable");
  }
  if (!tcp.listen.empty()) {
    if (!ValidHostPort(tcp.listen)) {
      errors->push_back("server.tcp.listen: expected host:port, got '" + tcp.listen + "'");
    }
    for (const auto& [value, key] : {std::pair{tcp.tls_cert_file, "tls_cert_file"},
                                     std::pair{tcp.tls_key_file, "tls_key_file"},
                                     std::pair{tcp.auth_token_file, "auth_token_file"}}) {
      if (value.empty()) {
        errors->push_back(std::string("server.tcp.") + key +
                          ": required when server.tcp.listen is set (TCP is served only with TLS and a bearer token)");
      } else {
        absolute(value, std::string("server.tcp.") + key);
      }
    }
  }
  const OpenAiApiConfig& api = c.server.openai_api;
  if (!api.listen.empty()) {
    const bool unix_socket = api.listen.rfind("unix:", 0) == 0;
    const bool tls = !api.tls_cert_file.empty() || !api.tls_key_file.empty();
    if (unix_socket) {
      const std::string path = api.listen.substr(5);
      // The socket is bound inside a private directory beside the path first (".offloadd-XXXXXX/s",
      // server/unix_socket.h), whose path must fit sockaddr_un's 107 bytes too.
      if (path.empty() || path.front() != '/') {
        errors->push_back(
            "server.openai_api.listen: '" + api.listen +
            "': a Unix socket's path must be absolute (unix:/run/offloadd/openai.sock)");
      } else if (path.size() + 19 > 107 || path.back() == '/') {
        errors->push_back("server.openai_api.listen: '" + api.listen +
                          "': not a file path of at most 88 bytes (a Unix socket's limit)");
      } else if (path == c.server.unix_socket) {
        errors->push_back("server.openai_api.listen: '" + api.listen +
                          "' is server.unix_socket, the gRPC API's socket; give it its own path");
      }
      if (tls) {
        errors->push_back(
            "server.openai_api.tls_cert_file, tls_key_file: TLS is for a TCP listen (host:port); "
            "on a Unix socket the socket's mode grants access");
      }
    } else if (!ValidHostPort(api.listen)) {
      errors->push_back("server.openai_api.listen: expected host:port or unix:/path, got '" +
                        api.listen + "'");
    } else {
      for (const auto& [value, key] : {std::pair{api.tls_cert_file, "tls_cert_file"},
                                       std::pair{api.tls_key_file, "tls_key_file"}}) {
        if (tls && value.empty()) {
          errors->push_back(std::string("server.openai_api.") + key +
                            ": required with the other (TLS needs a certificate and its key)");
        }
        absolute(value, std::string("server.openai_api.") + key);
      }
      if (!tls && !LoopbackHost(api.listen)) {
        errors->push_back(
            "server.openai_api.listen: '" + api.listen +
            "' is not a loopback address; without TLS the OpenAI API is served only on "
            "127.0.0.0/8, ::1 or localhost (set tls_cert_file and tls_key_file, or use "
            "unix:/path)");
      }
      if (api.auth_token_file.empty()) {
        errors->push_back(
            "server.openai_api.auth_token_file: required when server.openai_api.listen is a TCP "
            "address (or server.tcp.auth_token_file): every call carries a bearer token");
      }
      absolute(api.auth_token_file, "server.openai_api.auth_token_file");
    }
    absolute(api.data_dir, "server.openai_api.data_dir");
    absolute(api.model_dir, "server.openai_api.model_dir");
  }
  if (!c.metrics.listen.empty() && !ValidHostPort(c.metrics.listen)) {
    errors->push_back("metrics.listen: expected host:port (port 0 picks a free one), got '" + c.metrics.listen + "'");
  }
  for (size_t i = 0; i < c.storage.directories.size(); ++i) {
    const std::string key = "storage.directories[" + std::to_string(i) + "].path";
    if (c.storage.directories[i].path.empty()) errors->push_back(key + ": must not be empty");
    absolute(c.storage.directories[i].path, key);
  }
  if (c.storage.aio.block_size % 4096 != 0) {
    errors->push_back("storage.aio.block_size: must be a multiple of 4096 for O_DIRECT, got " +
                      std::to_string(c.storage.aio.block_size));
  }
}

}  // namespace

StatusOr<DaemonConfig> ParseConfig(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgumentError(source + ": not valid YAML: " + e.what());
  }
  DaemonConfig c;
  std::vector<std::string> errors;
  const YamlReader r(&errors, "");
  if (root && !root.IsNull()) {
    if (r.CheckMap(root, {"log_level", "state_dir", "allowed_roots", "server", "metrics", "storage",
                          "workers", "memory", "jobs", "cluster"})) {
      std::string level;
      r.String(root, "log_level", &level);
      if (!level.empty() && !ParseLogSeverity(level, &c.log_level)) {
        r.Error("log_level", "expected debug, info, warning or error, got '" + level + "'");
      }
      r.String(root, "state_dir", &c.state_dir);
      r.StringList(root, "allowed_roots", &c.allowed_roots);
      ReadServer(root["server"], r.Child("server"), &c.server);
      const YAML::Node m = root["metrics"];
      const YamlReader mr = r.Child("metrics");
      if (mr.CheckMap(m, {"listen", "peak_flops", "job_series_retention_seconds", "progress_interval_seconds"})) {
        mr.String(m, "listen", &c.metrics.listen);
        mr.Double(m, "peak_flops", &c.metrics.peak_flops, 0, 1e20);
        mr.Double(m, "job_series_retention_seconds", &c.metrics.job_series_retention_seconds, 0, 1e7);
        mr.Double(m, "progress_interval_seconds", &c.metrics.progress_interval_seconds, 0.1, 86400);
      }
      ReadStorage(root["storage"], r.Child("storage"), &c.storage);
      const YAML::Node w = root["workers"];
      const YamlReader wr = r.Child("workers");
      if (wr.CheckMap(w, {"processes", "threads_per_process", "pin_cores", "adamw_kernel"})) {
        wr.UInt32(w, "processes", &c.workers.processes, 0, 1024);
        wr.UInt32(w, "threads_per_process", &c.workers.threads_per_process, 0, 4096);
        wr.Bool(w, "pin_cores", &c.workers.pin_cores);
        wr.String(w, "adamw_kernel", &c.workers.adamw_kernel);
      }
      const YAML::Node mem = root["memory"];
      const YamlReader memr = r.Child("memory");
      if (memr.CheckMap(mem, {"host_memory_limit", "gpu_memory_limit"})) {
        memr.Bytes(mem, "host_memory_limit", &c.memory.host_memory_limit, 0, kMaxBytes);
        memr.Bytes(mem, "gpu_memory_limit", &c.memory.gpu_memory_limit, 0, kMaxBytes);
      }
      const YAML::Node jobs = root["jobs"];
      const YamlReader jr = r.Child("jobs");
      if (jr.CheckMap(jobs, {"max_executor_restarts", "cancel_grace_seconds",
                             "group_timeout_seconds", "liveness", "wait_for_lost_host_seconds"})) {
        jr.Double(jobs, "wait_for_lost_host_seconds", &c.jobs.wait_for_lost_host_seconds, 0, 86400);
        jr.UInt32(jobs, "max_executor_restarts", &c.jobs.max_executor_restarts, 0, 100);
        jr.Double(jobs, "cancel_grace_seconds", &c.jobs.cancel_grace_seconds, 0, 86400);
        jr.Double(jobs, "group_timeout_seconds", &c.jobs.group_timeout_seconds, 1, 86400);
        const YAML::Node live = jobs["liveness"];
        const YamlReader lr = jr.Child("liveness");
        if (lr.CheckMap(live, {"floor_seconds", "factor", "heartbeat_seconds"})) {
          lr.Double(live, "floor_seconds", &c.jobs.liveness.floor_seconds, 0, 86400);
          lr.Double(live, "factor", &c.jobs.liveness.factor, 1, 1000);
          lr.Double(live, "heartbeat_seconds", &c.jobs.liveness.heartbeat_seconds, 0.05, 3600);
        }
      }
      ReadCluster(root["cluster"], r.Child("cluster"), &c.cluster);
    }
  }
  // The OpenAI API's defaults come from settings beside it (and are printed as such).
  if (c.server.openai_api.auth_token_file.empty()) {
    c.server.openai_api.auth_token_file = c.server.tcp.auth_token_file;
  }
  if (c.server.openai_api.data_dir.empty() && !c.state_dir.empty()) {
    c.server.openai_api.data_dir = c.state_dir + "/openai";
  }
  if (c.cluster.name.empty()) c.cluster.name = DefaultClusterName();
  if (errors.empty()) Validate(c, &errors);
  if (!errors.empty()) {
    std::string msg = source + ": " + std::to_string(errors.size()) + " problem" +
                      (errors.size() == 1 ? "" : "s");
    for (const auto& e : errors) msg += "\n  " + e;
    return InvalidArgumentError(msg);
  }
  return c;
}

StatusOr<DaemonConfig> LoadConfigFile(const std::string& path) {
  // O_NONBLOCK + a regular-file check: a FIFO (or device) given as --config would otherwise block
  // the daemon, and --validate-config, for good.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoError(errno, "cannot read config file " + path);
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return InvalidArgumentError("config file " + path + " is not a regular file");
  }
  constexpr off_t kMaxConfigBytes = 1 << 20;
  if (st.st_size > kMaxConfigBytes) {
    close(fd);
    return InvalidArgumentError("config file " + path + " is larger than 1 MiB");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  text.resize(got);
  return ParseConfig(text, path);
}

namespace {

// A string value as it must be read back. yaml-cpp's emitter writes leading or trailing blanks
// and a trailing carriage return unquoted, and a reader then drops them (fuzz regression
// daemon_config/trailing-blanks-in-path: "/srv/offloadd add    \r"): values with whitespace at
// either end or any control character are double-quoted (escaped there).
struct Text {
  const std::string& s;
};
YAML::Emitter& operator<<(YAML::Emitter& e, Text t) {
  const auto space = [](unsigned char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r'); };
  const bool control = std::any_of(t.s.begin(), t.s.end(), [](unsigned char ch) { return ch < 0x20 || ch == 0x7f; });
  if (control || (!t.s.empty() && (space(t.s.front()) || space(t.s.back())))) e << YAML::DoubleQuoted;
  return e << t.s;
}

}  // namespace

std::string ConfigToYaml(const DaemonConfig& c) {
  static constexpr const char* kLevels[] = {"debug", "info", "warning", "error"};
  YAML::Emitter e;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", c.server.unix_socket_mode);
  e << YAML::BeginMap;
  e << YAML::Key << "log_level" << YAML::Value << kLevels[static_cast<int>(c.log_level)];
  e << YAML::Key << "state_dir" << YAML::Value << Text{c.state_dir};
  e << YAML::Key << "allowed_roots" << YAML::Value << YAML::BeginSeq;
  for (const auto& root : c.allowed_roots) e << Text{root};
  e << YAML::EndSeq;
  e << YAML::Key << "server" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "unix_socket" << YAML::Value << Text{c.server.unix_socket};
  e << YAML::Key << "unix_socket_mode" << YAML::Value << YAML::DoubleQuoted << mode;
  e << YAML::Key << "tcp" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "listen" << YAML::Value << Text{c.server.tcp.listen};
  e << YAML::Key << "tls_cert_file" << YAML::Value << Text{c.server.tcp.tls_cert_file};
  e << YAML::Key << "tls_key_file" << YAML::Value << Text{c.server.tcp.tls_key_file};
  e << YAML::Key << "auth_token_file" << YAML::Value << Text{c.server.tcp.auth_token_file};
  e << YAML::EndMap;
  const OpenAiApiConfig& api = c.server.openai_api;
  e << YAML::Key << "openai_api" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "listen" << YAML::Value << Text{api.listen};
  e << YAML::Key << "tls_cert_file" << YAML::Value << Text{api.tls_cert_file};
  e << YAML::Key << "tls_key_file" << YAML::Value << Text{api.tls_key_file};
  e << YAML::Key << "auth_token_file" << YAML::Value << Text{api.auth_token_file};
  e << YAML::Key << "data_dir" << YAML::Value << Text{api.data_dir};
  e << YAML::Key << "model_dir" << YAML::Value << Text{api.model_dir};
  e << YAML::Key << "max_upload_bytes" << YAML::Value << FormatByteSizeExact(api.max_upload_bytes);
  e << YAML::Key << "base_learning_rate" << YAML::Value << api.base_learning_rate;
  e << YAML::EndMap;
  e << YAML::Key << "max_request_bytes" << YAML::Value << FormatByteSizeExact(c.server.max_request_bytes);
  e << YAML::Key << "shutdown_grace_seconds" << YAML::Value << c.server.shutdown_grace_seconds;
  e << YAML::Key << "max_active_jobs_per_client" << YAML::Value << c.server.max_active_jobs_per_client;
  e << YAML::Key << "max_watchers_per_client" << YAML::Value << c.server.max_watchers_per_client;
  e << YAML::Key << "max_threads" << YAML::Value << c.server.max_threads;
  e << YAML::Key << "reserved_threads" << YAML::Value << c.server.reserved_threads;
  e << YAML::EndMap;
  e << YAML::Key << "metrics" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "listen" << YAML::Value << Text{c.metrics.listen};
  e << YAML::Key << "peak_flops" << YAML::Value << c.metrics.peak_flops;
  e << YAML::Key << "job_series_retention_seconds" << YAML::Value << c.metrics.job_series_retention_seconds;
  e << YAML::Key << "progress_interval_seconds" << YAML::Value << c.metrics.progress_interval_seconds
    << YAML::EndMap;
  e << YAML::Key << "storage" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "directories" << YAML::Value << YAML::BeginSeq;
  for (const auto& d : c.storage.directories) {
    e << YAML::BeginMap << YAML::Key << "path" << YAML::Value << Text{d.path} << YAML::Key << "weight"
      << YAML::Value << d.weight << YAML::EndMap;
  }
  e << YAML::EndSeq;
  e << YAML::Key << "aio" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "block_size" << YAML::Value << FormatByteSizeExact(c.storage.aio.block_size);
  e << YAML::Key << "queue_depth" << YAML::Value << c.storage.aio.queue_depth;
  e << YAML::EndMap << YAML::EndMap;
  e << YAML::Key << "workers" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "processes" << YAML::Value << c.workers.processes;
  e << YAML::Key << "threads_per_process" << YAML::Value << c.workers.threads_per_process;
  e << YAML::Key << "pin_cores" << YAML::Value << c.workers.pin_cores;
  e << YAML::Key << "adamw_kernel" << YAML::Value << Text{c.workers.adamw_kernel} << YAML::EndMap;
  e << YAML::Key << "memory" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "host_memory_limit" << YAML::Value << FormatByteSizeExact(c.memory.host_memory_limit);
  e << YAML::Key << "gpu_memory_limit" << YAML::Value << FormatByteSizeExact(c.memory.gpu_memory_limit);
  e << YAML::EndMap;
  e << YAML::Key << "jobs" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "max_executor_restarts" << YAML::Value << c.jobs.max_executor_restarts;
  e << YAML::Key << "cancel_grace_seconds" << YAML::Value << c.jobs.cancel_grace_seconds;
  e << YAML::Key << "group_timeout_seconds" << YAML::Value << c.jobs.group_timeout_seconds;
  e << YAML::Key << "liveness" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "floor_seconds" << YAML::Value << c.jobs.liveness.floor_seconds;
  e << YAML::Key << "factor" << YAML::Value << c.jobs.liveness.factor;
  e << YAML::Key << "heartbeat_seconds" << YAML::Value << c.jobs.liveness.heartbeat_seconds;
  e << YAML::EndMap;
  e << YAML::Key << "wait_for_lost_host_seconds" << YAML::Value
    << c.jobs.wait_for_lost_host_seconds;
  e << YAML::EndMap;
  EmitCluster(e, c.cluster);
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

}  // namespace offloadd::daemon
