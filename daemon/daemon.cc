#include "daemon/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/file.h"
#include "common/logging.h"
#include "common/safe_path.h"
#include "daemon/build_info.h"
#include "daemon/cluster/cluster_job_runner.h"
#include "daemon/cluster/peer_service.h"
#include "daemon/jobs/executor_job_runner.h"
#include "daemon/jobs/job_manager.h"
#include "daemon/jobs/job_store.h"
#include "daemon/metrics/metrics.h"
#include "daemon/metrics/peak_flops.h"
#include "daemon/metrics/train_metrics.h"
#include "daemon/node/node_probe.h"
#include "daemon/openai/openai_api.h"
#include "daemon/server/grpc_server.h"
#include "daemon/server/token_auth.h"
#include "daemon/systemd/sd_notify.h"

namespace offloadd::daemon {
namespace {

constexpr const char* kLog = "offloadd";

void LogEffectiveConfig(const DaemonConfig& config) {
  std::istringstream lines(ConfigToYaml(config));
  OFFLOADD_LOG(kInfo, kLog) << "effective configuration:";
  for (std::string line; std::getline(lines, line);) OFFLOADD_LOG(kInfo, kLog) << "  " << line;
}

// One daemon per state directory: a second one on the same directory re-ran a job the first was
// still training, into the same output directory. flock() is released by the kernel when the
// process dies, so a crashed daemon leaves no stale lock. The fd stays open for the process's life.
StatusOr<int> LockStateDir(const std::string& state_dir) {
  const std::string path = state_dir + "/offloadd.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoError(errno, "cannot open " + path);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    [[maybe_unused]] ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
    close(fd);
    if (err == EWOULDBLOCK) {
      return FailedPreconditionError("state_dir " + state_dir + " is in use by another offloadd (pid " +
                                     std::string(pid).substr(0, std::string(pid).find('\n')) +
                                     "); one daemon per state directory");
    }
    return ErrnoError(err, "cannot lock " + path);
  }
  const std::string me = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    OFFLOADD_LOG(kWarning, kLog) << "cannot write the pid into " << path;
  }
  return fd;
}

// Bounds the drain after SIGTERM: once server.shutdown_grace_seconds have passed, the process
// ends whatever the jobs and in-flight calls do (a frozen worker, a step that never finishes, a
// handler stuck in a syscall), since joining their threads could wait for ever. A job cut off
// this way is still RUNNING in the store and resumes from its last checkpoint on the next start.
class ShutdownWatchdog {
 public:
  ShutdownWatchdog(std::chrono::steady_clock::time_point deadline, double grace_seconds)
      : thread_([this, deadline, grace_seconds] {
          std::unique_lock<std::mutex> lock(mu_);
          if (cv_.wait_until(lock, deadline, [this] { return disarmed_; })) return;
          OFFLOADD_LOG(kError, kLog) << "the daemon did not stop within the grace period ("
                                     << grace_seconds << " s): exiting now; a job cut off resumes "
                                     << "from its last checkpoint on the next start";
          [[maybe_unused]] Status ignored = SdNotify("STATUS=grace period over: exiting");
          std::fflush(nullptr);
          std::_Exit(1);  // no destructors: they would join the threads that are stuck
        }) {}
  ~ShutdownWatchdog() { Disarm(); }
  void Disarm() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      disarmed_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool disarmed_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

const char* LogSeverityName(LogSeverity s) {
  static constexpr const char* kNames[] = {"debug", "info", "warning", "error"};
  return kNames[static_cast<int>(s)];
}

int Fail(const Status& s) {
  OFFLOADD_LOG(kError, kLog) << s.ToString();
  [[maybe_unused]] Status ignored = SdNotify("STATUS=failed: " + s.message());
  return 1;
}

// The GPUs jobs train on, as a short-lived executor finds them (SetProbedGpus records them for
// the node probe); none when the driver is too old for the bundled CUDA runtime, which is logged.
std::vector<GpuFacts> ProbeDaemonGpus(const std::string& executor_binary) {
  std::string gpu_problem;
  // Two statements: the order in which one call's arguments are evaluated is unspecified, and
  // the problem must be read after the probe wrote it.
  GpuDriverFacts driver;
  std::vector<GpuFacts> probed =
      ProbeGpusWithExecutor(executor_binary, &gpu_problem, 60000, &driver);
  driver.driver_version = ReadNvidiaDriverVersion();
  // A GPU whose driver is too old for the bundled CUDA runtime is an error, not a CPU node: jobs
  // are refused at validation until the driver is upgraded or the GPUs are hidden on purpose.
  const std::string driver_problem =
      GpusHiddenByEnvironment(std::getenv("CUDA_VISIBLE_DEVICES")) ? "" : GpuDriverProblem(driver);
  if (!driver_problem.empty()) {
    OFFLOADD_LOG(kError, kLog) << "GPU unusable: " << driver_problem
                               << "; until then jobs are refused";
    probed.clear();
    gpu_problem = driver_problem;
  }
  SetProbedGpus(std::move(probed), gpu_problem, DescribeGpuDriver(driver), driver_problem);
  const std::vector<GpuFacts> gpus = ProbeGpus(&gpu_problem);
  if (gpus.empty() && driver_problem.empty()) {
    OFFLOADD_LOG(kInfo, kLog) << "no GPU (" << (gpu_problem.empty() ? "none visible" : gpu_problem)
                              << "): jobs train on the CPU";
  }
  return gpus;
}

// How the daemon's executors are started and watched, from its config.
StatusOr<ExecutorRunnerOptions> RunnerOptions(const DaemonConfig& config,
                                              const std::string& executor_binary, bool has_gpu) {
  ExecutorRunnerOptions runner_options;
  runner_options.executor_binary = executor_binary;
  runner_options.environment = DaemonTrainerEnvironment(config, has_gpu);
  runner_options.state_dir = config.state_dir;
  runner_options.max_restarts = config.jobs.max_executor_restarts;
  runner_options.cancel_grace_seconds = config.jobs.cancel_grace_seconds;
  runner_options.group_timeout_seconds = config.jobs.group_timeout_seconds;
  runner_options.liveness_floor_seconds = config.jobs.liveness.floor_seconds;
  runner_options.liveness_factor = config.jobs.liveness.factor;
  runner_options.heartbeat_seconds = config.jobs.liveness.heartbeat_seconds;
  runner_options.log_level = LogSeverityName(config.log_level);
  if (!config.server.tcp.listen.empty()) {  // read once more: CheckStartup accepted it above
    auto tokens = ReadTokenFile(config.server.tcp.auth_token_file);
    if (!tokens.ok()) return tokens.status();
    for (const ClientToken& t : *tokens) runner_options.token_users[t.name] = t.user;
  }
  return runner_options;
}

// MFU needs the GPU's peak: metrics.peak_flops, else the table of known GPUs.
double MfuPeakFlops(const DaemonConfig& config, const std::vector<GpuFacts>& gpus) {
  double peak_flops = config.metrics.peak_flops;
  if (peak_flops <= 0 && !gpus.empty()) {
    peak_flops = KnownPeakBf16Flops(gpus[0].name);
    OFFLOADD_LOG(kInfo, kLog)
        << "MFU peak for " << gpus[0].name << ": "
        << (peak_flops > 0 ? std::to_string(peak_flops / 1e12) + " TFLOP/s bf16 (known GPU)"
                           : std::string("unknown; set metrics.peak_flops to export MFU"));
  }
  return peak_flops;
}

// Where the gRPC server listens, as the log and systemd's status line say it.
std::string GrpcEndpoints(const DaemonConfig& config, int tcp_port) {
  std::string where;
  if (!config.server.unix_socket.empty()) where = "unix:" + config.server.unix_socket;
  if (tcp_port != 0) {
    where += (where.empty() ? "" : " and ") + std::string("tcp port ") + std::to_string(tcp_port) +
             " (TLS)";
  }
  return where;
}

// The server of cluster.listen for the parts of jobs other daemons coordinate (null when it is not
// set), and the cluster's setup, logged.
StatusOr<std::unique_ptr<PeerServer>> StartPeerServer(const ClusterConfig& cluster,
                                                      JobManager* jobs,
                                                      ExecutorJobRunner* executors) {
  std::unique_ptr<PeerServer> server;
  if (!cluster.listen.empty()) {
    ASSIGN_OR_RETURN(server, PeerServer::Start(cluster, jobs, executors));
    OFFLOADD_LOG(kInfo, kLog) << "serving peer daemons on port " << server->port()
                              << " (mutual TLS) as cluster host " << cluster.name;
  }
  if (!cluster.peers.empty()) {
    OFFLOADD_LOG(kInfo, kLog) << "coordinating jobs across up to " << cluster.peers.size() + 1
                              << " hosts (cluster.peers)";
  }
  return server;
}

}  // namespace

// What CreateJob admits a job against (JobManager::Submit): the allowed roots, and the node as
// probed at each call (memory, GPUs, store directories) with this daemon's defaults.
JobManager::Options JobManagerOptionsFor(const DaemonConfig& config, int gpus) {
  JobManager::Options options;
  options.gpus = gpus;
  options.allowed_roots = config.allowed_roots;
  options.probe_node = [config] {
    std::vector<StoreDirInput> dirs;
    for (const auto& d : config.storage.directories) dirs.push_back({d.path, d.weight});
    const NodeFacts facts = ProbeNodeResources(dirs);
    NodeBudget node;
    node.host_memory_bytes = facts.memory.total_bytes;
    node.host_memory = trainer::ProbeNodeMemory();
    node.host_memory_limit = config.memory.host_memory_limit;
    node.gpu_memory_limit = config.memory.gpu_memory_limit;
    node.gpus = facts.gpus;
    node.gpu_driver_problem = facts.gpu_driver_problem;
    node.cpu_cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    node.cluster_hosts = 1 + static_cast<int>(config.cluster.peers.size());
    node.profile_dir = config.state_dir + "/profiles";
    node.aio_block_size = config.storage.aio.block_size;
    node.aio_queue_depth = config.storage.aio.queue_depth;
    for (const auto& d : facts.store_dirs) {
      (d.problem.empty() ? node.store_dirs : node.unusable_store_dirs).push_back(d);
    }
    return node;
  };
  return options;
}

int RunDaemon(const DaemonConfig& config) {
  signal(SIGPIPE, SIG_IGN);
  OFFLOADD_LOG(kInfo, kLog) << "offloadd " << OFFLOADD_VERSION << " (" << OFFLOADD_GIT_REVISION << ", "
                            << OFFLOADD_FLAVOUR << " flavour, LibTorch " << OFFLOADD_TORCH_VERSION << ") starting";
  LogEffectiveConfig(config);

  // POSIX calls of common/file.h, shared with the torch-linked executor.
  if (Status s = MakeDirs(config.state_dir); !s.ok()) {
    return Fail(s.WithContext("cannot create state_dir " + config.state_dir));
  }
  auto lock = LockStateDir(config.state_dir);
  if (!lock.ok()) return Fail(lock.status());
  std::vector<std::string> warnings;
  if (Status s = CheckStartup(config, &warnings); !s.ok()) return Fail(s);
  for (const std::string& w : warnings) OFFLOADD_LOG(kWarning, kLog) << w;

  // From here on, every file a job opens or creates must stay under allowed_roots at the moment
  // it is used, not only when CreateJob validated the path (common/safe_path.h).
  SetAllowedRoots(config.allowed_roots);

  const BuildFacts build{OFFLOADD_VERSION, OFFLOADD_GIT_REVISION, OFFLOADD_TORCH_VERSION,
                         std::string(OFFLOADD_FLAVOUR) == "cuda"};
  auto metrics = DaemonMetrics::Start(
      config.metrics.listen, {build.version, build.revision, build.torch_version, OFFLOADD_FLAVOUR});
  if (!metrics.ok()) return Fail(metrics.status());
  if (!config.metrics.listen.empty()) {
    const std::string host = config.metrics.listen.substr(0, config.metrics.listen.rfind(':'));
    OFFLOADD_LOG(kInfo, kLog) << "metrics listening on " << host << ":" << (*metrics)->port();
  }

  auto store = JobStore::Open(config.state_dir + "/jobs.db");
  if (!store.ok()) return Fail(store.status());
  // Jobs train on the GPU when the probe finds one (CUDA flavour), else on the CPU. The daemon
  // does not load CUDA: a short-lived executor asks the CUDA runtime.
  const std::string executor_binary = FindSiblingBinary("offloadd-executor", "executor");
  const std::vector<GpuFacts> gpus = ProbeDaemonGpus(executor_binary);
  TrainMetrics train_metrics(
      (*metrics)->registry(),
      {.peak_flops = MfuPeakFlops(config, gpus),
       .job_series_retention_seconds = config.metrics.job_series_retention_seconds,
       .clock = {}});
  auto runner_options = RunnerOptions(config, executor_binary, !gpus.empty());
  if (!runner_options.ok()) return Fail(runner_options.status());
  // This host's executors run its jobs (one host's, or rank 0 of one across hosts) and the peers'.
  auto runner = std::make_unique<ClusterJobRunner>(
      config.cluster,
      std::make_unique<ExecutorJobRunner>(std::move(*runner_options), &train_metrics));
  ExecutorJobRunner* const executors = runner->local();
  const TrainerEnvironment& env = executors->options().environment;
  OFFLOADD_LOG(kInfo, kLog) << "training: " << (gpus.empty() ? "cpu" : "cuda") << " in "
                            << executor_binary << " (one per job and GPU), "
                            << env.worker_processes() << " optimizer worker process(es) per job, "
                            << env.worker_binary();
  // train_metrics outlives the manager, which reports counts until its scheduler stops.
  auto jobs = JobManager::Start(
      std::move(*store), std::move(runner),
      [&train_metrics](const JobManager::StateCounts& counts) {
        train_metrics.SetJobsByState(counts);
      },
      JobManagerOptionsFor(config, static_cast<int>(gpus.size())));
  if (!jobs.ok()) return Fail(jobs.status());

  // Signals are set up before the server starts so an early SIGTERM is not lost.
  boost::asio::io_context io;
  boost::asio::signal_set signals(io, SIGTERM, SIGINT);
  int received = 0;
  // Ended jobs' series go once their retention has passed, scraped or not.
  boost::asio::steady_timer sweep(io);
  std::function<void()> arm_sweep = [&] {
    sweep.expires_after(std::chrono::seconds(15));
    sweep.async_wait([&](const boost::system::error_code& error) {
      if (error) return;  // cancelled: shutting down
      train_metrics.Sweep();
      arm_sweep();
    });
  };
  arm_sweep();
  // With WatchdogSec= in the unit, systemd restarts a daemon that stops sending WATCHDOG=1. It is
  // sent from this loop, so a wedged main loop goes unanswered; twice per interval, as
  // sd_watchdog_enabled(3) advises.
  auto watchdog_interval = SdWatchdogInterval();
  if (!watchdog_interval.ok()) return Fail(watchdog_interval.status());
  boost::asio::steady_timer watchdog_timer(io);
  std::function<void()> arm_watchdog = [&] {
    if (!*watchdog_interval) return;
    watchdog_timer.expires_after(**watchdog_interval / 2);
    watchdog_timer.async_wait([&](const boost::system::error_code& error) {
      if (error) return;  // cancelled: shutting down
      if (Status s = SdNotify("WATCHDOG=1"); !s.ok()) {
        OFFLOADD_LOG(kWarning, kLog) << "systemd watchdog: " << s.ToString();
      }
      arm_watchdog();
    });
  };
  if (*watchdog_interval) {
    OFFLOADD_LOG(kInfo, kLog) << "systemd watchdog: every "
                              << std::chrono::duration<double>(**watchdog_interval).count() << " s";
  }
  arm_watchdog();
  signals.async_wait([&](const boost::system::error_code& error, int signo) {
    if (!error) received = signo;
    sweep.cancel();
    watchdog_timer.cancel();
  });

  auto server = GrpcServer::Start(config, build, jobs->get(), metrics->get());
  if (!server.ok()) return Fail(server.status());
  const std::string where = GrpcEndpoints(config, (*server)->tcp_port());
  // Health is NOT_SERVING, with the reason in NodeInfo.serving_problem and the log, while jobs
  // are not durable (the job database deleted, a full or read-only state directory).
  (*jobs)->SetHealthSink([&server, &metrics](const std::string& problem) {
    (*server)->SetServing(problem.empty());
    (*metrics)->SetServing(problem.empty());
  });
  OFFLOADD_LOG(kInfo, kLog) << "serving gRPC on " << where;
  auto peer_server = StartPeerServer(config.cluster, jobs->get(), executors);
  if (!peer_server.ok()) return Fail(peer_server.status());
  // The OpenAI-compatible API, when server.openai_api.listen is set: a frontend of the same jobs.
  std::unique_ptr<openai::OpenAiApi> openai_api;
  if (!config.server.openai_api.listen.empty()) {
    auto api = openai::OpenAiApi::Start(config, jobs->get());
    if (!api.ok()) return Fail(api.status());
    openai_api = std::move(*api);
    OFFLOADD_LOG(kInfo, kLog) << "serving the OpenAI fine-tuning API on " << openai_api->url();
  }
  if (Status s = SdNotify("READY=1\nSTATUS=serving on " + where); !s.ok()) {
    OFFLOADD_LOG(kWarning, kLog) << "sd_notify failed: " << s.ToString();
  }

  io.run();  // returns once the signal handler has run

  OFFLOADD_LOG(kInfo, kLog) << (received == SIGINT ? "SIGINT" : "SIGTERM") << ": draining (grace "
                            << config.server.shutdown_grace_seconds << " s)";
  [[maybe_unused]] Status ignored = SdNotify("STOPPING=1\nSTATUS=draining");
  (*jobs)->SetHealthSink({});
  (*metrics)->SetServing(false);
  if (openai_api) openai_api->Shutdown();  // requests being handled finish first
  if (*peer_server) (*peer_server)->Shutdown();  // the peers' parts here stop with their streams
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(config.server.shutdown_grace_seconds * 1000));
  ShutdownWatchdog watchdog(deadline, config.server.shutdown_grace_seconds);
  // Stop the job core first: watchers end with UNAVAILABLE and their resume cursor, and a running
  // job is asked to checkpoint and pause; then in-flight calls drain in what is left of the grace.
  (*jobs)->Shutdown();
  const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
  (*server)->Shutdown(std::max(0.0, left));
  watchdog.Disarm();
  OFFLOADD_LOG(kInfo, kLog) << "stopped cleanly";
  return 0;
}

}  // namespace offloadd::daemon
