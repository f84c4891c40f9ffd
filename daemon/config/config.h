#pragma once
// The daemon's configuration: /etc/offloadd/offloadd.yaml (or --config) loaded into typed structs.
// Loading is strict: unknown keys, wrong types and out-of-range values are errors that name the
// key path ("server.tcp.listen"). Every error in the file is reported at once.

#include <cstdint>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/status.h"

namespace offloadd::daemon {

inline constexpr const char* kDefaultConfigPath = "/etc/offloadd/offloadd.yaml";

struct TcpConfig {
  // "host:port" to listen on; empty disables TCP. TCP requires TLS and a bearer token.
  std::string listen;
  std::string tls_cert_file;
  std::string tls_key_file;
  // File holding the bearer token clients must send ("authorization: Bearer <token>").
  std::string auth_token_file;
};

// The OpenAI-compatible fine-tuning API (daemon/openai/, docs/openai_api.md): HTTP beside gRPC,
// off unless `listen` is set. Authenticated as gRPC is (docs/security.md): on TCP every call
// carries a bearer token of `auth_token_file`, and only a loopback address is served without TLS;
// on a Unix socket the socket's mode (server.unix_socket_mode) grants access and each client is
// the local user it runs as (SO_PEERCRED).
struct OpenAiApiConfig {
  // "host:port" (port 0 picks one): on 127.0.0.0/8, ::1 or localhost, or on any address with
  // tls_cert_file and tls_key_file; or "unix:/absolute/path".
  std::string listen;
  // PEM files: TLS on the TCP listener (https), the certificate chain and its private key.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string auth_token_file;  // default: server.tcp.auth_token_file
  // Uploaded files (files/) and fine-tuned models (models/); must lie under allowed_roots, since
  // the jobs read and write there. Default: <state_dir>/openai.
  std::string data_dir;
  // `model` of a job: an absolute model directory, or the name of one in this directory.
  std::string model_dir;
  uint64_t max_upload_bytes = 256ull << 20;  // one POST /v1/files body
  // learning_rate = learning_rate_multiplier x this (Hugging Face's default learning rate).
  double base_learning_rate = 5e-5;
};

struct ServerConfig {
  std::string unix_socket = "/run/offloadd/offloadd.sock";
  uint32_t unix_socket_mode = 0660;
  TcpConfig tcp;
  OpenAiApiConfig openai_api;
  uint64_t max_request_bytes = 4ull << 20;
  // SIGTERM: in-flight calls get this long to finish before they are cancelled.
  double shutdown_grace_seconds = 30;
  // Per client (a TCP address, or a local user on the Unix socket, by SO_PEERCRED uid): jobs it
  // created that are queued, running or paused (counted from the job store at start), and WatchJob
  // streams open at once.
  uint32_t max_active_jobs_per_client = 1000;
  uint32_t max_watchers_per_client = 1024;
  // All clients together: server threads handling calls at once (grpc::ResourceQuota). A call
  // beyond it gets RESOURCE_EXHAUSTED; the backstop when many clients each stay under their limits.
  uint32_t max_threads = 4096;
  // Of max_threads, kept for short calls (GetJob, ListJobs, CancelJob, PauseJob, ResumeJob,
  // health): CreateJob and WatchJob calls, which hold a thread for long, get the rest (less 2 for
  // gRPC's pollers), one client at most half of that. 0: max_threads / 8, within [2, 64].
  uint32_t reserved_threads = 0;
};

struct MetricsConfig {
  // "host:port" for the Prometheus endpoint; port 0 picks a free port; empty disables it.
  std::string listen = "127.0.0.1:9464";
  // Peak dense FLOP/s of the device jobs train on, in their compute dtype (bf16 tensor-core
  // FLOP/s on a GPU): the denominator of offloadd_train_mfu_ratio. 0 = unknown, MFU not exported.
  double peak_flops = 0;
  // A job's offloadd_train_* series (and offloadd_job_info) stay this long after it stops running,
  // so that short jobs are scraped and dashboards keep their last values; 0 removes them at once.
  double job_series_retention_seconds = 900;
  // A running job reports a progress event at least this often, whatever its logging_steps (its
  // steps still report every logging_steps as well): `offloadctl watch` is never silent for long.
  double progress_interval_seconds = 10;
};

struct StoreDirectoryConfig {
  std::string path;
  double weight = 1.0;
};

struct AioConfig {
  uint64_t block_size = 1ull << 20;
  uint32_t queue_depth = 32;
};

struct StorageConfig {
  std::vector<StoreDirectoryConfig> directories;
  AioConfig aio;
};

struct WorkersConfig {
  // 0 = one process per NUMA node.
  uint32_t processes = 0;
  // 0 = all cores of the process's NUMA node, minus those the daemon keeps.
  uint32_t threads_per_process = 0;
  bool pin_cores = true;
  // CPU AdamW kernel flavour (auto | portable | avx2 | avx512 | avx512bf16); auto defers to
  // $OFFLOADD_ADAMW_KERNEL, then the fastest this CPU supports. Refused at startup when the CPU
  // lacks the instructions.
  std::string adamw_kernel = "auto";
};

struct MemoryConfig {
  // Upper bound for pinned host memory (arena + workers); 0 = 80% of physical memory.
  uint64_t host_memory_limit = 0;
  // Default per-job GPU budget; 0 = the GPU's free memory.
  uint64_t gpu_memory_limit = 0;
};

// Liveness deadlines on every wait between the daemon, a job's executors, its optimizer workers,
// its NVMe store and its data-parallel ranks (docs/faults.md). A process that misses one is
// logged, counted (offloadd_watchdog_kills_total), killed and recovered as after its crash.
struct LivenessConfig {
  // Work handed to a worker or the store must finish within max(floor_seconds, factor x its
  // expected time from the node profile); a training step of an executor within floor_seconds +
  // max(floor_seconds, factor x the recent steps' time) (one floor more, so that the deadlines
  // inside the step act first). 0 turns these deadlines off (the heartbeats stay).
  double floor_seconds = 120;
  double factor = 10;
  // An executor reports a heartbeat this often; one silent for max(6 heartbeats, 1 s) (stopped,
  // wedged in the kernel) is killed.
  double heartbeat_seconds = 5;
};

struct JobsConfig {
  // How often a job whose executor died (a signal, a non-zero exit, a lost socket, a liveness
  // deadline, its NVMe store's death: not a training error) starts again from its last checkpoint
  // before it fails with the cause. 0: never.
  uint32_t max_executor_restarts = 2;
  // CancelJob asks the job's executors to stop at their next step; those still running this long
  // after are killed (SIGKILL). CancelJob with `force` kills them at once.
  double cancel_grace_seconds = 30;
  // A data-parallel job's ranks: the bound on joining the group and on every collective (the
  // c10d store and process group timeout; Gloo's own default is 600 s).
  double group_timeout_seconds = 300;
  LivenessConfig liveness;
  // Waiting for a lost host of a job across hosts and resuming when it returns: not built, so
  // any value but 0 is refused by name (a lost host fails the job; cluster.lost_host_seconds).
  double wait_for_lost_host_seconds = 0;
};

// A peer daemon this one coordinates for jobs across hosts (resources.hosts).
struct PeerConfig {
  std::string name;     // how errors and logs name the host
  std::string address;  // host:port of its cluster.listen
};

// Jobs across hosts (docs/data_parallel.md, "The daemon coordinating peer daemons"): the daemon a
// job is submitted to coordinates `peers`, each of which serves parts of such jobs on `listen`.
// Between daemons: mutual TLS (both ends present a certificate of `tls_ca_file`'s CA) and the
// bearer token of `token_file` (one bare token, mode 0600, the same on every host).
struct ClusterConfig {
  std::string name;  // this host in the cluster's logs and errors; default: the hostname
  // host:port where peer daemons reach this one (serves parts of their jobs); empty: none.
  std::string listen;
  // The address the peers reach this host's rendezvous at (a job's rank 0 serves its c10d store
  // there, on a free port); required with peers.
  std::string advertise_address;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  std::string token_file;
  std::vector<PeerConfig> peers;  // a job of H hosts runs on this one and the first H-1 of these
  double reserve_timeout_seconds = 30;  // every peer reserves its part within this, or none runs
  // A peer silent this long (its connection's keepalive unanswered) is lost: the job fails
  // naming it.
  double lost_host_seconds = 10;
};

struct DaemonConfig {
  LogSeverity log_level = LogSeverity::kInfo;
  // Job database, checkpoints by default, runtime files.
  std::string state_dir = "/var/lib/offloadd";
  // Model, dataset and output paths of jobs must resolve (after symlinks) under one of these.
  std::vector<std::string> allowed_roots = {"/var/lib/offloadd"};
  ServerConfig server;
  MetricsConfig metrics;
  StorageConfig storage;
  WorkersConfig workers;
  MemoryConfig memory;
  JobsConfig jobs;
  ClusterConfig cluster;
};

// Parses YAML text. `source` names the origin in messages (a file path or "<string>").
StatusOr<DaemonConfig> ParseConfig(const std::string& yaml_text, const std::string& source);
// Reads and parses a file; a missing/unreadable file is an error naming the path.
StatusOr<DaemonConfig> LoadConfigFile(const std::string& path);
// The effective configuration as YAML, every key present (what the daemon prints at startup).
std::string ConfigToYaml(const DaemonConfig& config);

}  // namespace offloadd::daemon
