#include "daemon/metrics/train_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <iterator>
#include <map>
#include <optional>
#include <mutex>
#include <set>
#include <unordered_map>

namespace offloadd::daemon {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

// Steps of an offloaded 7B model take seconds to minutes; of a tiny test model, milliseconds.
const Histogram::BucketBoundaries& StepBuckets() {
  static const Histogram::BucketBoundaries kBuckets = {
      0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000};
  return kBuckets;
}

// Label values of the per-resource families; the order matches the StepStats fields read in
// Observe.
// lsp_compress and lsp_decompress (LSP mode) are GPU time on their own series: P^T G Q inside
// each backward (part of gpu_compute), W_base + P A Q^T before each block computes (not part of it).
constexpr std::array<const char*, 7> kPhases = {"gpu_compute", "h2d",          "d2h",           "cpu_update",
                                                "nvme",        "lsp_compress", "lsp_decompress"};
constexpr std::array<const char*, 3> kStalls = {"weights", "grads", "optimizer"};
constexpr std::array<const char*, 4> kLinks = {"h2d", "d2h", "nvme_read", "nvme_write"};
// Exact clipping with speculative updates (workers/step_driver.h).
constexpr std::array<const char*, 3> kClipEvents = {"clipped_steps", "speculated_layers",
                                                    "corrected_layers"};

Family<Gauge>& GaugeFamily(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}
Family<Counter>& CounterFamily(prometheus::Registry& r, const char* name, const char* help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r);
}

}  // namespace

struct TrainMetrics::Impl {
  // The series of one job, looked up once and kept until ClearJob.
  struct JobSeries {
    Counter* steps;
    Counter* tokens;
    Gauge* step;
    Gauge* max_steps;
    Gauge* epoch;
    Gauge* loss;
    Gauge* learning_rate;
    Gauge* grad_norm;
    Gauge* tokens_per_second;
    Gauge* model_flops_per_second;
    Gauge* mfu;  // null when the peak is unknown
    Gauge* gpu_memory_peak;
    Histogram* step_seconds;
    std::array<Counter*, kPhases.size()> phase;
    std::array<Counter*, kStalls.size()> stall;
    std::array<Counter*, kLinks.size()> link;
    std::array<Counter*, kClipEvents.size()> clip;
    std::array<Counter*, 2> updated;  // cpu, device
    // Created on a job's first evaluation / projector check (null before).
    Gauge* eval_loss = nullptr;
    Gauge* eval_step = nullptr;
    Counter* lsp_checks = nullptr;
    Counter* lsp_switched = nullptr;
    Counter* lsp_seconds = nullptr;
    std::array<Gauge*, 2> lsp_bias{};  // in_use, learned
    Gauge* info = nullptr;  // offloadd_job_info, from StartJob
    // Created on a run's first step (null before): time to it and the set-up phases.
    Gauge* time_to_first_step = nullptr;
    std::array<Gauge*, trainer::kSetupPhases.size()> setup_phase{};
    std::array<Gauge*, trainer::kSetupPhases.size()> setup_phase_start{};
    // The job's helper processes (ObserveRuntime); counters follow cumulative figures by their
    // increase since the last report (a restarted process starts again from 0).
    struct WorkerSeries {
      pid_t pid = -1;
      Counter* cpu;
      Counter* busy;
      Counter* params;
      Counter* restarts;
      Gauge* queue_depth;
      double last_cpu = 0, last_busy = 0, last_params = 0, last_restarts = 0;
    };
    std::map<int, WorkerSeries> workers;
    struct StoreSeries {
      pid_t pid = -1;
      Counter* cpu;
      Counter* ok;
      Counter* errors;
      Gauge* in_flight;
      Histogram* latency;
      double last_cpu = 0, last_ok = 0, last_errors = 0, last_sum = 0;
      std::vector<uint64_t> last_counts;
    };
    std::map<std::string, StoreSeries> stores;
    double last_worker_watchdog_kills = 0;
    Gauge* arena = nullptr;
    Gauge* pinned = nullptr;
    // Set by EndJob: the series go once job_series_retention_seconds have passed since.
    std::optional<std::chrono::steady_clock::time_point> ended;
  };

  Impl(prometheus::Registry& r, Options o)
      : options(o),
        jobs(GaugeFamily(r, "offloadd_jobs", "Jobs known to the daemon, by state.")),
        steps(CounterFamily(r, "offloadd_train_steps_total",
                            "Optimizer steps finished by this daemon process.")),
        tokens(CounterFamily(r, "offloadd_train_tokens_total",
                             "Input tokens of the finished optimizer steps.")),
        step(GaugeFamily(r, "offloadd_train_step", "Last finished optimizer step (1-based).")),
        max_steps(GaugeFamily(r, "offloadd_train_max_steps", "Optimizer steps the job will run.")),
        epoch(GaugeFamily(r, "offloadd_train_epoch", "Fractional epochs of the dataset seen.")),
        loss(GaugeFamily(r, "offloadd_train_loss", "Mean token loss of the last step.")),
        learning_rate(
            GaugeFamily(r, "offloadd_train_learning_rate", "Learning rate of the last step.")),
        grad_norm(GaugeFamily(r, "offloadd_train_grad_norm",
                              "Global gradient L2 norm of the last step, before clipping.")),
        tokens_per_second(GaugeFamily(r, "offloadd_train_tokens_per_second",
                                      "Input tokens per second of wall time in the last step.")),
        model_flops_per_second(GaugeFamily(
            r, "offloadd_train_model_flops_per_second",
            "Model FLOP/s of the last step (6 x params x tokens plus attention, recompute not "
            "counted).")),
        // Only with a known peak: a family that can never hold a sample would only confuse.
        mfu(o.peak_flops > 0
                ? &GaugeFamily(r, "offloadd_train_mfu_ratio",
                               "Model FLOP utilisation of the last step: model FLOP/s over the "
                               "GPU's peak bf16 FLOP/s.")
                : nullptr),
        gpu_memory_peak(GaugeFamily(r, "offloadd_gpu_memory_peak_bytes",
                                    "Peak GPU memory reserved by the job's CUDA allocator.")),
        step_seconds(prometheus::BuildHistogram()
                         .Name("offloadd_train_step_seconds")
                         .Help("Wall time of one optimizer step.")
                         .Register(r)),
        phase(CounterFamily(
            r, "offloadd_train_step_phase_seconds_total",
            "Busy time of each resource inside optimizer steps (LSP mode: lsp_compress, "
            "GPU time inside gpu_compute; lsp_decompress, GPU time beside it).")),
        stall(CounterFamily(r, "offloadd_train_stall_seconds_total",
                            "Time the compute stream or step loop waited, by what it waited for "
                            "(weights, gradient staging buffers, optimizer updates).")),
        link(CounterFamily(r, "offloadd_link_bytes_total",
                           "Bytes moved per link: PCIe host-to-device and device-to-host, NVMe "
                           "reads and writes.")),
        clip(
            CounterFamily(r, "offloadd_train_clip_events_total",
                          "Steps whose gradients max_grad_norm scaled down (clipped_steps), layers "
                          "updated before the step's norm was known (speculated_layers) and, of "
                          "those, corrected to the clip coefficient (corrected_layers).")),
        updated(
            CounterFamily(r, "offloadd_train_updated_params_total",
                          "Parameters passed through AdamW, by where their states live: the CPU "
                          "workers (corrections included) or the GPU (device-resident blocks).")),
        eval_loss(
            GaugeFamily(r, "offloadd_train_eval_loss",
                        "Mean token loss on the job's held-out records (dataset.eval_paths) at "
                        "its last evaluation.")),
        eval_step(
            GaugeFamily(r, "offloadd_train_eval_step", "Optimizer step of the last evaluation.")),
        lsp_checks(CounterFamily(r, "offloadd_train_lsp_checks_total",
                                 "LSP-Offload projector checks (Alg. 2) run by the job.")),
        lsp_switched(
            CounterFamily(r, "offloadd_train_lsp_switched_matrices_total",
                          "Matrices whose projectors a check replaced with learned ones.")),
        lsp_seconds(CounterFamily(r, "offloadd_train_lsp_check_seconds_total",
                                  "Wall time of the projector checks (probe, learning, switch).")),
        lsp_bias(
            GaugeFamily(r, "offloadd_train_lsp_bias",
                        "Mean relative bias ||C(G) - G||^2 / ||G||^2 at the last check: of the "
                        "projectors in use, and of the learned ones that replaced them.")),
        worker_cpu(
            CounterFamily(r, "offloadd_worker_cpu_seconds_total",
                          "User and system CPU time of each optimizer worker process of the job.")),
        worker_busy(CounterFamily(r, "offloadd_worker_busy_seconds_total",
                                  "Time each optimizer worker spent executing update commands.")),
        worker_params(CounterFamily(r, "offloadd_worker_updated_params_total",
                                    "Parameters each optimizer worker passed through AdamW.")),
        worker_restarts(CounterFamily(r, "offloadd_worker_restarts_total",
                                      "Restarts of each optimizer worker after it died.")),
        worker_queue(
            GaugeFamily(r, "offloadd_worker_queue_depth",
                        "Update commands submitted to each worker and not yet completed.")),
        store_cpu(CounterFamily(r, "offloadd_job_store_cpu_seconds_total",
                                "User and system CPU time of the job's NVMe store process, by role "
                                "(optimizer: the states' tier; activations).")),
        store_requests(
            CounterFamily(r, "offloadd_job_store_requests_total",
                          "Requests the job's NVMe store completed, as the job saw them, by "
                          "role and result (ok, error).")),
        store_in_flight(
            GaugeFamily(r, "offloadd_job_store_requests_in_flight",
                        "Requests submitted to the job's NVMe store and not yet completed.")),
        store_latency(prometheus::BuildHistogram()
                          .Name("offloadd_job_store_latency_seconds")
                          .Help("Submit-to-completion time of the job's NVMe store requests.")
                          .Register(r)),
        arena(
            GaugeFamily(r, "offloadd_job_host_arena_bytes",
                        "The job's shared host arena: fp32 master weights, Adam states, staging.")),
        pinned(GaugeFamily(r, "offloadd_job_host_pinned_bytes",
                           "Host memory the job page-locked for the GPU's copies.")),
        time_to_first_step(GaugeFamily(
            r, "offloadd_train_time_to_first_step_seconds",
            "Seconds from the trainer's creation (the job's executor starting it, or "
            "restarting it) to the start of the run's first step: checkpoint reading, arena, "
            "workers, pinning.")),
        setup_phase(GaugeFamily(
            r, "offloadd_train_setup_phase_seconds",
            "Wall seconds of each phase of the run's set-up before its first step (cuda, model, "
            "data, plan, arena, workers, weights, device; job/step_stats.h kSetupPhases). Phases "
            "overlap (the arena is populated while the workers start, the weights are read and the "
            "device is set up): see offloadd_train_setup_phase_start_seconds.")),
        setup_phase_start(GaugeFamily(
            r, "offloadd_train_setup_phase_start_seconds",
            "When each set-up phase first began, seconds from the trainer's creation (-1: it did "
            "not run); with offloadd_train_setup_phase_seconds, the phases' intervals.")),
        job_info(GaugeFamily(
            r, "offloadd_job_info",
            "1 for each job with series here, with the GPUs its executors use (\"0,1\"; "
            "\"cpu\"); offloadctl get <job_id> names the job. Kept "
            "with the job's other series for metrics.job_series_retention_seconds "
            "after the job stops running.")),
        watchdog_kills(CounterFamily(
            r, "offloadd_watchdog_kills_total",
            "Processes of jobs killed for missing a liveness deadline (stopped, wedged, "
            "deadlocked), by process: executor, worker, store (jobs.liveness).")) {
    // Every process kind from the start, so that a rate over it never lacks a series.
    for (const char* p : {"executor", "worker", "store"}) watchdog_kills.Add({{"process", p}});
  }

  std::chrono::steady_clock::time_point Now() const {
    return options.clock ? options.clock() : std::chrono::steady_clock::now();
  }
  void RemoveLocked(std::unordered_map<std::string, JobSeries>::iterator it);
  // Removes the series of jobs that ended at least the retention ago.
  void SweepLocked() {
    const auto now = Now();
    const auto keep = std::chrono::duration<double>(options.job_series_retention_seconds);
    for (auto it = by_job.begin(); it != by_job.end();) {
      auto next = std::next(it);
      if (it->second.ended && now - *it->second.ended >= keep) RemoveLocked(it);
      it = next;
    }
  }

  JobSeries& SeriesLocked(const std::string& job_id) {
    auto it = by_job.find(job_id);
    if (it != by_job.end()) return it->second;
    const prometheus::Labels l = {{"job_id", job_id}};
    auto with = [&l](const char* key, const char* value) {
      prometheus::Labels out = l;
      out.emplace(key, value);
      return out;
    };
    JobSeries s{};
    s.steps = &steps.Add(l);
    s.tokens = &tokens.Add(l);
    s.step = &step.Add(l);
    s.max_steps = &max_steps.Add(l);
    s.epoch = &epoch.Add(l);
    s.loss = &loss.Add(l);
    s.learning_rate = &learning_rate.Add(l);
    s.grad_norm = &grad_norm.Add(l);
    s.tokens_per_second = &tokens_per_second.Add(l);
    s.model_flops_per_second = &model_flops_per_second.Add(l);
    s.mfu = mfu != nullptr ? &mfu->Add(l) : nullptr;
    s.gpu_memory_peak = &gpu_memory_peak.Add(l);
    s.step_seconds = &step_seconds.Add(l, StepBuckets());
    for (size_t i = 0; i < kPhases.size(); ++i)
      s.phase[i] = &phase.Add(with("resource", kPhases[i]));
    for (size_t i = 0; i < kStalls.size(); ++i)
      s.stall[i] = &stall.Add(with("resource", kStalls[i]));
    for (size_t i = 0; i < kLinks.size(); ++i) s.link[i] = &link.Add(with("link", kLinks[i]));
    for (size_t i = 0; i < kClipEvents.size(); ++i) s.clip[i] = &clip.Add(with("event", kClipEvents[i]));
    s.updated = {&updated.Add(with("where", "cpu")), &updated.Add(with("where", "device"))};
    return by_job.emplace(job_id, s).first->second;
  }

  const Options options;
  Family<Gauge>& jobs;
  Family<Counter>& steps;
  Family<Counter>& tokens;
  Family<Gauge>& step;
  Family<Gauge>& max_steps;
  Family<Gauge>& epoch;
  Family<Gauge>& loss;
  Family<Gauge>& learning_rate;
  Family<Gauge>& grad_norm;
  Family<Gauge>& tokens_per_second;
  Family<Gauge>& model_flops_per_second;
  Family<Gauge>* mfu;  // null when the peak is unknown
  Family<Gauge>& gpu_memory_peak;
  Family<Histogram>& step_seconds;
  Family<Counter>& phase;
  Family<Counter>& stall;
  Family<Counter>& link;
  Family<Counter>& clip;
  Family<Counter>& updated;
  Family<Gauge>& eval_loss;
  Family<Gauge>& eval_step;
  Family<Counter>& lsp_checks;
  Family<Counter>& lsp_switched;
  Family<Counter>& lsp_seconds;
  Family<Gauge>& lsp_bias;
  Family<Counter>& worker_cpu;
  Family<Counter>& worker_busy;
  Family<Counter>& worker_params;
  Family<Counter>& worker_restarts;
  Family<Gauge>& worker_queue;
  Family<Counter>& store_cpu;
  Family<Counter>& store_requests;
  Family<Gauge>& store_in_flight;
  Family<Histogram>& store_latency;
  Family<Gauge>& arena;
  Family<Gauge>& pinned;
  Family<Gauge>& time_to_first_step;
  Family<Gauge>& setup_phase;
  Family<Gauge>& setup_phase_start;
  Family<Gauge>& job_info;
  Family<Counter>& watchdog_kills;

  std::mutex mu;
  std::unordered_map<std::string, JobSeries> by_job;  // guarded by mu
  std::set<std::string> states_seen;                  // guarded by mu
};

TrainMetrics::TrainMetrics(prometheus::Registry& registry, Options options)
    : impl_(std::make_unique<Impl>(registry, options)) {}

TrainMetrics::~TrainMetrics() = default;

void TrainMetrics::Observe(const std::string& job_id, const trainer::StepStats& s) {
  std::lock_guard lock(impl_->mu);
  Impl::JobSeries& j = impl_->SeriesLocked(job_id);
  j.ended.reset();  // running (again)
  j.steps->Increment();
  j.tokens->Increment(static_cast<double>(s.tokens));
  j.step->Set(static_cast<double>(s.step));
  j.max_steps->Set(static_cast<double>(s.max_steps));
  j.epoch->Set(s.epoch);
  j.loss->Set(s.loss);
  j.learning_rate->Set(s.learning_rate);
  j.grad_norm->Set(s.grad_norm);
  j.gpu_memory_peak->Set(static_cast<double>(s.gpu_peak_bytes));
  j.step_seconds->Observe(s.step_seconds);
  // Rates of a step that took no measurable time would be infinite: keep the previous values.
  if (s.step_seconds > 0) {
    const double flops_per_second = s.model_flops / s.step_seconds;
    j.tokens_per_second->Set(static_cast<double>(s.tokens) / s.step_seconds);
    j.model_flops_per_second->Set(flops_per_second);
    if (j.mfu != nullptr) j.mfu->Set(flops_per_second / impl_->options.peak_flops);
  }
  // prometheus-cpp counters ignore negative increments, so a clock hiccup cannot decrease them.
  const std::array<double, kPhases.size()> phase = {
      s.gpu_compute_seconds, s.h2d_seconds,          s.d2h_seconds,           s.cpu_update_seconds,
      s.nvme_seconds,        s.lsp_compress_seconds, s.lsp_decompress_seconds};
  const std::array<double, kStalls.size()> stall = {s.stall_weights_seconds, s.stall_grads_seconds,
                                                    s.stall_optimizer_seconds};
  const std::array<uint64_t, kLinks.size()> link = {s.h2d_bytes, s.d2h_bytes, s.nvme_read_bytes,
                                                    s.nvme_write_bytes};
  for (size_t i = 0; i < phase.size(); ++i) j.phase[i]->Increment(phase[i]);
  for (size_t i = 0; i < stall.size(); ++i) j.stall[i]->Increment(stall[i]);
  for (size_t i = 0; i < link.size(); ++i) j.link[i]->Increment(static_cast<double>(link[i]));
  j.clip[0]->Increment(s.clipped ? 1 : 0);
  j.clip[1]->Increment(s.speculated_layers);
  j.clip[2]->Increment(s.corrected_layers);
  j.updated[0]->Increment(static_cast<double>(s.cpu_update_params));
  j.updated[1]->Increment(static_cast<double>(s.device_update_params));
  if (!s.setup_phase_seconds.empty()) {  // a run's first step
    if (j.time_to_first_step == nullptr) {
      j.time_to_first_step = &impl_->time_to_first_step.Add({{"job_id", job_id}});
      for (size_t i = 0; i < trainer::kSetupPhases.size(); ++i) {
        j.setup_phase[i] = &impl_->setup_phase.Add({{"job_id", job_id}, {"phase", trainer::kSetupPhases[i]}});
        j.setup_phase_start[i] =
            &impl_->setup_phase_start.Add({{"job_id", job_id}, {"phase", trainer::kSetupPhases[i]}});
      }
    }
    j.time_to_first_step->Set(s.time_to_first_step_seconds);
    for (size_t i = 0; i < j.setup_phase.size(); ++i) {
      j.setup_phase[i]->Set(i < s.setup_phase_seconds.size() ? s.setup_phase_seconds[i] : 0.0);
      j.setup_phase_start[i]->Set(i < s.setup_phase_start_seconds.size() ? s.setup_phase_start_seconds[i] : -1.0);
    }
  }
}

void TrainMetrics::ObserveEval(const std::string& job_id, const trainer::EvalStats& e) {
  std::lock_guard lock(impl_->mu);
  Impl::JobSeries& j = impl_->SeriesLocked(job_id);
  const prometheus::Labels l = {{"job_id", job_id}};
  if (j.eval_loss == nullptr) {
    j.eval_loss = &impl_->eval_loss.Add(l);
    j.eval_step = &impl_->eval_step.Add(l);
  }
  j.eval_loss->Set(e.loss);
  j.eval_step->Set(static_cast<double>(e.step));
}

void TrainMetrics::ObserveProjectorCheck(const std::string& job_id, const trainer::ProjectorCheckStats& c) {
  std::lock_guard lock(impl_->mu);
  Impl::JobSeries& j = impl_->SeriesLocked(job_id);
  if (j.lsp_checks == nullptr) {
    const prometheus::Labels l = {{"job_id", job_id}};
    j.lsp_checks = &impl_->lsp_checks.Add(l);
    j.lsp_switched = &impl_->lsp_switched.Add(l);
    j.lsp_seconds = &impl_->lsp_seconds.Add(l);
    j.lsp_bias = {&impl_->lsp_bias.Add({{"job_id", job_id}, {"projectors", "in_use"}}),
                  &impl_->lsp_bias.Add({{"job_id", job_id}, {"projectors", "learned"}})};
  }
  j.lsp_checks->Increment();
  j.lsp_switched->Increment(c.switched);
  j.lsp_seconds->Increment(c.seconds);
  j.lsp_bias[0]->Set(c.mean_bias);
  if (c.switched > 0) j.lsp_bias[1]->Set(c.mean_bias_after);
}

namespace {
// A counter that mirrors a cumulative figure: grows by its increase; a figure that went down
// started again from 0 (a restarted process).
void Follow(Counter* c, double* last, double now) {
  c->Increment(now >= *last ? now - *last : now);
  *last = now;
}
}  // namespace

void TrainMetrics::ObserveRuntime(const std::string& job_id, const trainer::RuntimeStats& r) {
  std::lock_guard lock(impl_->mu);
  Impl& m = *impl_;
  Impl::JobSeries& j = m.SeriesLocked(job_id);
  for (const trainer::RuntimeStats::Worker& w : r.workers) {
    auto [it, fresh] = j.workers.try_emplace(w.index);
    Impl::JobSeries::WorkerSeries& s = it->second;
    if (fresh) {
      const prometheus::Labels l = {{"job_id", job_id}, {"worker", std::to_string(w.index)}};
      s.cpu = &m.worker_cpu.Add(l);
      s.busy = &m.worker_busy.Add(l);
      s.params = &m.worker_params.Add(l);
      s.restarts = &m.worker_restarts.Add(l);
      s.queue_depth = &m.worker_queue.Add(l);
    }
    if (s.pid != w.pid) s.last_cpu = 0;  // a new process: its CPU time starts from 0
    s.pid = w.pid;
    Follow(s.cpu, &s.last_cpu, w.cpu_seconds);
    Follow(s.busy, &s.last_busy, w.busy_seconds);
    Follow(s.params, &s.last_params, static_cast<double>(w.params_updated));
    Follow(s.restarts, &s.last_restarts, w.restarts);
    s.queue_depth->Set(w.queue_depth);
  }
  for (const trainer::RuntimeStats::Store& st : r.stores) {
    auto [it, fresh] = j.stores.try_emplace(st.role);
    Impl::JobSeries::StoreSeries& s = it->second;
    if (fresh) {
      const prometheus::Labels l = {{"job_id", job_id}, {"role", st.role}};
      s.cpu = &m.store_cpu.Add(l);
      s.ok = &m.store_requests.Add({{"job_id", job_id}, {"role", st.role}, {"result", "ok"}});
      s.errors = &m.store_requests.Add({{"job_id", job_id}, {"role", st.role}, {"result", "error"}});
      s.in_flight = &m.store_in_flight.Add(l);
      s.latency = &m.store_latency.Add(l, st.latency_bounds_seconds);
    }
    if (s.pid != st.pid) {  // a new store process: its figures start again
      s.last_cpu = s.last_ok = s.last_errors = s.last_sum = 0;
      s.last_counts.clear();
    }
    s.pid = st.pid;
    Follow(s.cpu, &s.last_cpu, st.cpu_seconds);
    Follow(s.ok, &s.last_ok, static_cast<double>(st.completed - st.errors));
    Follow(s.errors, &s.last_errors, static_cast<double>(st.errors));
    s.in_flight->Set(st.in_flight);
    // Buckets: the increase of each since the last report (the histogram's own layout).
    std::vector<double> increments(st.latency_counts.size(), 0);
    s.last_counts.resize(st.latency_counts.size(), 0);
    bool any = false;
    for (size_t i = 0; i < increments.size(); ++i) {
      increments[i] = static_cast<double>(st.latency_counts[i] - std::min(st.latency_counts[i], s.last_counts[i]));
      any = any || increments[i] > 0;
    }
    if (any) s.latency->ObserveMultiple(increments, std::max(0.0, st.latency_sum_seconds - s.last_sum));
    s.last_counts = st.latency_counts;
    s.last_sum = st.latency_sum_seconds;
  }
  if (j.arena == nullptr) {
    j.arena = &m.arena.Add({{"job_id", job_id}});
    j.pinned = &m.pinned.Add({{"job_id", job_id}});
  }
  j.arena->Set(static_cast<double>(r.arena_bytes));
  j.pinned->Set(static_cast<double>(r.pinned_host_bytes));
}

void TrainMetrics::ObserveWorkerWatchdogKills(const std::string& job_id, uint64_t total) {
  std::lock_guard lock(impl_->mu);
  Impl::JobSeries& j = impl_->SeriesLocked(job_id);
  const double kills = static_cast<double>(total);
  if (kills > j.last_worker_watchdog_kills) {
    impl_->watchdog_kills.Add({{"process", "worker"}}).Increment(kills - j.last_worker_watchdog_kills);
  }
  j.last_worker_watchdog_kills = kills;
}

void TrainMetrics::CountWatchdogKill(const std::string& process) {
  std::lock_guard lock(impl_->mu);
  impl_->watchdog_kills.Add({{"process", process}}).Increment();
}

void TrainMetrics::SetJobsByState(const std::map<std::string, int64_t>& counts) {
  std::lock_guard lock(impl_->mu);
  for (const auto& [state, n] : counts) impl_->states_seen.insert(state);
  for (const std::string& state : impl_->states_seen) {
    auto it = counts.find(state);
    impl_->jobs.Add({{"state", state}})
        .Set(it == counts.end() ? 0 : static_cast<double>(it->second));
  }
}

void TrainMetrics::StartJob(const std::string& job_id, const std::string& gpus) {
  std::lock_guard lock(impl_->mu);
  Impl::JobSeries& j = impl_->SeriesLocked(job_id);
  j.ended.reset();
  if (j.info != nullptr) impl_->job_info.Remove(j.info);
  j.info = &impl_->job_info.Add({{"job_id", job_id}, {"gpus", gpus.empty() ? "cpu" : gpus}});
  j.info->Set(1);
  impl_->SweepLocked();
}

void TrainMetrics::EndJob(const std::string& job_id) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->by_job.find(job_id);
  if (it != impl_->by_job.end()) it->second.ended = impl_->Now();
  impl_->SweepLocked();
}

void TrainMetrics::Sweep() {
  std::lock_guard lock(impl_->mu);
  impl_->SweepLocked();
}

void TrainMetrics::ClearJob(const std::string& job_id) {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->by_job.find(job_id);
  if (it != impl_->by_job.end()) impl_->RemoveLocked(it);
}

void TrainMetrics::Impl::RemoveLocked(std::unordered_map<std::string, JobSeries>::iterator it) {
  Impl& m = *this;
  const Impl::JobSeries& j = it->second;
  m.steps.Remove(j.steps);
  m.tokens.Remove(j.tokens);
  m.step.Remove(j.step);
  m.max_steps.Remove(j.max_steps);
  m.epoch.Remove(j.epoch);
  m.loss.Remove(j.loss);
  m.learning_rate.Remove(j.learning_rate);
  m.grad_norm.Remove(j.grad_norm);
  m.tokens_per_second.Remove(j.tokens_per_second);
  m.model_flops_per_second.Remove(j.model_flops_per_second);
  if (j.mfu != nullptr) m.mfu->Remove(j.mfu);
  m.gpu_memory_peak.Remove(j.gpu_memory_peak);
  m.step_seconds.Remove(j.step_seconds);
  for (Counter* c : j.phase) m.phase.Remove(c);
  for (Counter* c : j.stall) m.stall.Remove(c);
  for (Counter* c : j.link) m.link.Remove(c);
  for (Counter* c : j.clip) m.clip.Remove(c);
  for (Counter* c : j.updated) m.updated.Remove(c);
  if (j.eval_loss != nullptr) {
    m.eval_loss.Remove(j.eval_loss);
    m.eval_step.Remove(j.eval_step);
  }
  if (j.lsp_checks != nullptr) {
    m.lsp_checks.Remove(j.lsp_checks);
    m.lsp_switched.Remove(j.lsp_switched);
    m.lsp_seconds.Remove(j.lsp_seconds);
    for (Gauge* g : j.lsp_bias) m.lsp_bias.Remove(g);
  }
  if (j.info != nullptr) m.job_info.Remove(j.info);
  if (j.time_to_first_step != nullptr) {
    m.time_to_first_step.Remove(j.time_to_first_step);
    for (Gauge* g : j.setup_phase) m.setup_phase.Remove(g);
    for (Gauge* g : j.setup_phase_start) m.setup_phase_start.Remove(g);
  }
  for (const auto& [index, w] : j.workers) {
    m.worker_cpu.Remove(w.cpu);
    m.worker_busy.Remove(w.busy);
    m.worker_params.Remove(w.params);
    m.worker_restarts.Remove(w.restarts);
    m.worker_queue.Remove(w.queue_depth);
  }
  for (const auto& [role, st] : j.stores) {
    m.store_cpu.Remove(st.cpu);
    m.store_requests.Remove(st.ok);
    m.store_requests.Remove(st.errors);
    m.store_in_flight.Remove(st.in_flight);
    m.store_latency.Remove(st.latency);
  }
  if (j.arena != nullptr) {
    m.arena.Remove(j.arena);
    m.pinned.Remove(j.pinned);
  }
  m.by_job.erase(it);
}

}  // namespace offloadd::daemon
