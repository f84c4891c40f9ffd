#include "daemon/metrics/train_metrics.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "daemon/metrics/metrics.h"
#include "daemon/metrics/peak_flops.h"

namespace offloadd::daemon {
namespace {

std::string Scrape(prometheus::Registry& r) {
  return prometheus::TextSerializer().Serialize(r.Collect());
}

// Sample lines of the exposition: "name{labels}" -> value.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

trainer::StepStats Step(int64_t step) {
  trainer::StepStats s;
  s.step = step;
  s.max_steps = 100;
  s.epoch = 0.5;
  s.tokens = 4096;
  s.trained_tokens = 4000;
  s.loss = 2.25;
  s.learning_rate = 1e-5;
  s.grad_norm = 0.75;
  s.step_seconds = 2.0;
  s.model_flops = 1e15;
  s.gpu_compute_seconds = 1.5;
  s.h2d_seconds = 1.0;
  s.d2h_seconds = 0.5;
  s.cpu_update_seconds = 1.25;
  s.nvme_seconds = 0.25;
  s.lsp_compress_seconds = 0.0625;
  s.lsp_decompress_seconds = 0.03125;
  s.stall_weights_seconds = 0.125;
  s.stall_grads_seconds = 0.0625;
  s.stall_optimizer_seconds = 0.375;
  s.h2d_bytes = 1000;
  s.d2h_bytes = 2000;
  s.nvme_read_bytes = 3000;
  s.nvme_write_bytes = 4000;
  s.gpu_peak_bytes = int64_t{40} << 30;
  return s;
}

TEST(TrainMetricsTest, StepsAccumulateCountersAndSetGauges) {
  prometheus::Registry registry;
  TrainMetrics::Options options;
  options.peak_flops = 1e15;
  TrainMetrics m(registry, options);
  m.Observe("a", Step(1));
  trainer::StepStats second = Step(2);
  second.loss = 2.0;
  second.step_seconds = 4.0;
  second.clipped = true;
  second.speculated_layers = 3;
  second.corrected_layers = 3;
  second.cpu_update_params = 600;
  second.device_update_params = 400;
  m.Observe("a", second);
  m.Observe("b", Step(7));

  auto s = Samples(Scrape(registry));
  EXPECT_EQ(s[R"(offloadd_train_steps_total{job_id="a"})"], 2);
  EXPECT_EQ(s[R"(offloadd_train_steps_total{job_id="b"})"], 1);
  EXPECT_EQ(s[R"(offloadd_train_tokens_total{job_id="a"})"], 8192);
  EXPECT_EQ(s[R"(offloadd_train_step{job_id="a"})"], 2);
  EXPECT_EQ(s[R"(offloadd_train_step{job_id="b"})"], 7);
  EXPECT_EQ(s[R"(offloadd_train_max_steps{job_id="a"})"], 100);
  EXPECT_EQ(s[R"(offloadd_train_epoch{job_id="a"})"], 0.5);
  EXPECT_EQ(s[R"(offloadd_train_loss{job_id="a"})"], 2.0);
  EXPECT_EQ(s[R"(offloadd_train_loss{job_id="b"})"], 2.25);
  EXPECT_EQ(s[R"(offloadd_train_learning_rate{job_id="a"})"], 1e-5);
  EXPECT_EQ(s[R"(offloadd_train_grad_norm{job_id="a"})"], 0.75);
  EXPECT_EQ(s[R"(offloadd_train_tokens_per_second{job_id="a"})"], 1024);  // 4096 / 4 s
  EXPECT_EQ(s[R"(offloadd_train_model_flops_per_second{job_id="a"})"], 2.5e14);
  EXPECT_EQ(s[R"(offloadd_train_mfu_ratio{job_id="a"})"], 0.25);
  EXPECT_EQ(s[R"(offloadd_train_mfu_ratio{job_id="b"})"], 0.5);
  EXPECT_EQ(s[R"(offloadd_gpu_memory_peak_bytes{job_id="a"})"], 40.0 * (1 << 30));
  EXPECT_EQ(s[R"(offloadd_train_step_seconds_count{job_id="a"})"], 2);
  EXPECT_EQ(s[R"(offloadd_train_step_seconds_sum{job_id="a"})"], 6);
  EXPECT_EQ(s[R"(offloadd_train_step_seconds_bucket{job_id="a",le="2.5"})"], 1);
  EXPECT_EQ(s[R"(offloadd_train_step_seconds_bucket{job_id="a",le="5"})"], 2);
  EXPECT_EQ(s[R"(offloadd_train_step_phase_seconds_total{job_id="a",resource="gpu_compute"})"], 3);
  EXPECT_EQ(s[R"(offloadd_train_step_phase_seconds_total{job_id="a",resource="h2d"})"], 2);
  EXPECT_EQ(s[R"(offloadd_train_step_phase_seconds_total{job_id="a",resource="d2h"})"], 1);
  EXPECT_EQ(s[R"(offloadd_train_step_phase_seconds_total{job_id="a",resource="cpu_update"})"], 2.5);
  EXPECT_EQ(s[R"(offloadd_train_step_phase_seconds_total{job_id="a",resource="nvme"})"], 0.5);
  EXPECT_EQ(s[R"(offloadd_train_step_phase_seconds_total{job_id="a",resource="lsp_compress"})"], 0.125);
  EXPECT_EQ(s[R"(offloadd_train_step_phase_seconds_total{job_id="a",resource="lsp_decompress"})"], 0.0625);
  EXPECT_EQ(s[R"(offloadd_train_stall_seconds_total{job_id="a",resource="weights"})"], 0.25);
  EXPECT_EQ(s[R"(offloadd_train_stall_seconds_total{job_id="a",resource="grads"})"], 0.125);
  EXPECT_EQ(s[R"(offloadd_train_stall_seconds_total{job_id="a",resource="optimizer"})"], 0.75);
  EXPECT_EQ(s[R"(offloadd_link_bytes_total{job_id="a",link="h2d"})"], 2000);
  EXPECT_EQ(s[R"(offloadd_link_bytes_total{job_id="a",link="d2h"})"], 4000);
  EXPECT_EQ(s[R"(offloadd_link_bytes_total{job_id="a",link="nvme_read"})"], 6000);
  EXPECT_EQ(s[R"(offloadd_link_bytes_total{job_id="b",link="nvme_write"})"], 4000);
  EXPECT_EQ(s[R"(offloadd_train_clip_events_total{event="clipped_steps",job_id="a"})"], 1);
  EXPECT_EQ(s[R"(offloadd_train_clip_events_total{event="speculated_layers",job_id="a"})"], 3);
  EXPECT_EQ(s[R"(offloadd_train_clip_events_total{event="corrected_layers",job_id="a"})"], 3);
  EXPECT_EQ(s[R"(offloadd_train_clip_events_total{event="clipped_steps",job_id="b"})"], 0);
  EXPECT_EQ(s[R"(offloadd_train_updated_params_total{job_id="a",where="cpu"})"],
            600 + Step(1).cpu_update_params);
  EXPECT_EQ(s[R"(offloadd_train_updated_params_total{job_id="a",where="device"})"], 400);
}

TEST(TrainMetricsTest, NoMfuWithoutPeakAndNoRatesFromZeroLengthSteps) {
  prometheus::Registry registry;
  TrainMetrics m(registry);
  m.Observe("a", Step(1));
  trainer::StepStats instant = Step(2);
  instant.step_seconds = 0;
  m.Observe("a", instant);
  const std::string text = Scrape(registry);
  EXPECT_EQ(text.find("offloadd_train_mfu_ratio"), std::string::npos);
  auto s = Samples(text);
  EXPECT_EQ(s[R"(offloadd_train_tokens_per_second{job_id="a"})"], 2048);  // from step 1
  EXPECT_EQ(s[R"(offloadd_train_step{job_id="a"})"], 2);
}

TEST(TrainMetricsTest, ClearJobRemovesOnlyThatJobsSeries) {
  prometheus::Registry registry;
  TrainMetrics::Options options;
  options.peak_flops = 1e15;
  TrainMetrics m(registry, options);
  m.Observe("a", Step(1));
  m.Observe("b", Step(1));
  m.ClearJob("a");
  m.ClearJob("never-ran");
  const std::string text = Scrape(registry);
  EXPECT_EQ(text.find(R"(job_id="a")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"(offloadd_train_mfu_ratio{job_id="b"})"), std::string::npos);
  // A cleared job that runs again starts its counters from zero.
  m.Observe("a", Step(2));
  EXPECT_EQ(Samples(Scrape(registry))[R"(offloadd_train_steps_total{job_id="a"})"], 1);
}

// A job's series, with offloadd_job_info, stay for the retention after EndJob (so a job shorter
// than a scrape interval is still scraped), then go; a job that runs again before that continues
// its counters.
TEST(TrainMetricsTest, EndedJobsSeriesStayForTheRetentionWithTheirInfo) {
  prometheus::Registry registry;
  auto now = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  TrainMetrics::Options options;
  options.job_series_retention_seconds = 60;
  options.clock = [&now] { return now; };
  TrainMetrics m(registry, options);
  m.StartJob("a");
  m.Observe("a", Step(1));
  m.StartJob("b", "0,1");
  m.EndJob("a");
  const char* info_a = R"(offloadd_job_info{gpus="cpu",job_id="a"})";
  auto v = Samples(Scrape(registry));
  EXPECT_EQ(v[info_a], 1) << Scrape(registry);
  EXPECT_EQ(v[R"(offloadd_train_steps_total{job_id="a"})"], 1);
  now += std::chrono::seconds(59);
  m.Sweep();
  EXPECT_NE(Scrape(registry).find(R"(job_id="a")"), std::string::npos) << "within the retention";
  now += std::chrono::seconds(1);
  m.Sweep();
  std::string text = Scrape(registry);
  EXPECT_EQ(text.find(R"(job_id="a")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"(offloadd_job_info{gpus="0,1",job_id="b"})"), std::string::npos)
      << "a running job's series stay";
  // Ended, then resumed within the retention: the removal is cancelled and counters continue.
  m.Observe("b", Step(1));
  m.EndJob("b");
  now += std::chrono::seconds(30);
  m.StartJob("b", "0,1");
  m.Observe("b", Step(2));
  now += std::chrono::seconds(3600);
  m.Sweep();
  EXPECT_EQ(Samples(Scrape(registry))[R"(offloadd_train_steps_total{job_id="b"})"], 2);
  // Retention 0: gone at EndJob.
  prometheus::Registry r0;
  TrainMetrics m0(r0, {.peak_flops = 0, .job_series_retention_seconds = 0, .clock = {}});
  m0.StartJob("c");
  m0.EndJob("c");
  EXPECT_EQ(Scrape(r0).find(R"(job_id="c")"), std::string::npos);
}

// The job's helper processes: counters follow the cumulative figures (a restarted worker, with a
// new pid, starts its CPU time from 0 again), the store's latency buckets grow by their increase,
// and everything goes with the job's series.
TEST(TrainMetricsTest, WorkerAndStoreSeriesFollowTheJobsProcesses) {
  prometheus::Registry registry;
  TrainMetrics m(registry);
  trainer::RuntimeStats r;
  trainer::RuntimeStats::Worker w;
  w.index = 0;
  w.pid = 100;
  w.cpu_seconds = 2.0;
  w.busy_seconds = 1.5;
  w.params_updated = 1000;
  w.queue_depth = 1;
  r.workers.push_back(w);
  trainer::RuntimeStats::Store st;
  st.role = "optimizer";
  st.pid = 200;
  st.cpu_seconds = 0.5;
  st.submitted = 4;
  st.completed = 4;
  st.errors = 1;
  st.latency_bounds_seconds = {0.001, 0.01};
  st.latency_counts = {1, 3, 0};
  st.latency_sum_seconds = 0.02;
  r.stores.push_back(st);
  r.arena_bytes = 1 << 20;
  r.pinned_host_bytes = 1 << 19;
  m.ObserveRuntime("a", r);
  w.pid = 101;  // restarted: a new process, its CPU time from 0
  w.cpu_seconds = 0.25;
  w.busy_seconds = 2.5;
  w.params_updated = 1500;
  w.queue_depth = 3;
  w.restarts = 2;
  r.workers[0] = w;
  r.stores[0].completed = 6;
  r.stores[0].latency_counts = {2, 4, 0};
  r.stores[0].latency_sum_seconds = 0.03;
  r.stores[0].in_flight = 2;
  m.ObserveRuntime("a", r);
  auto v = Samples(Scrape(registry));
  EXPECT_DOUBLE_EQ(v[R"(offloadd_worker_cpu_seconds_total{job_id="a",worker="0"})"], 2.25);
  EXPECT_DOUBLE_EQ(v[R"(offloadd_worker_busy_seconds_total{job_id="a",worker="0"})"], 2.5);
  EXPECT_EQ(v[R"(offloadd_worker_updated_params_total{job_id="a",worker="0"})"], 1500);
  EXPECT_EQ(v[R"(offloadd_worker_restarts_total{job_id="a",worker="0"})"], 2);
  EXPECT_EQ(v[R"(offloadd_worker_queue_depth{job_id="a",worker="0"})"], 3);
  EXPECT_EQ(v[R"(offloadd_job_store_requests_total{job_id="a",result="ok",role="optimizer"})"], 5);
  EXPECT_EQ(v[R"(offloadd_job_store_requests_total{job_id="a",result="error",role="optimizer"})"], 1);
  EXPECT_EQ(v[R"(offloadd_job_store_requests_in_flight{job_id="a",role="optimizer"})"], 2);
  EXPECT_EQ(v[R"(offloadd_job_store_latency_seconds_count{job_id="a",role="optimizer"})"], 6);
  EXPECT_EQ(v[R"(offloadd_job_store_latency_seconds_bucket{job_id="a",role="optimizer",le="0.001"})"], 2);
  EXPECT_EQ(v[R"(offloadd_job_store_latency_seconds_bucket{job_id="a",role="optimizer",le="0.01"})"], 6);
  EXPECT_NEAR(v[R"(offloadd_job_store_latency_seconds_sum{job_id="a",role="optimizer"})"], 0.03, 1e-12);
  EXPECT_EQ(v[R"(offloadd_job_host_arena_bytes{job_id="a"})"], 1 << 20);
  EXPECT_EQ(v[R"(offloadd_job_host_pinned_bytes{job_id="a"})"], 1 << 19);
  m.ClearJob("a");
  const std::string text = Scrape(registry);
  EXPECT_EQ(text.find(R"(job_id="a")"), std::string::npos) << text;
}

// Evaluation and LSP check series exist only for jobs that evaluate / run LSP, and go with
// ClearJob. Processes killed for missing a liveness deadline, by kind; every kind has its series
// from the start, and the workers' count follows each job's cumulative count by increase.
TEST(TrainMetricsTest, WatchdogKillsCountByProcess) {
  prometheus::Registry registry;
  TrainMetrics m(registry);
  auto v = Samples(Scrape(registry));
  for (const char* p : {"executor", "worker", "store"}) {
    EXPECT_EQ(v.count(std::string("offloadd_watchdog_kills_total{process=\"") + p + "\"}"), 1u) << p;
  }
  m.CountWatchdogKill("executor");
  m.CountWatchdogKill("store");
  m.CountWatchdogKill("store");
  m.ObserveWorkerWatchdogKills("a", 2);
  m.ObserveWorkerWatchdogKills("a", 2);  // the same cumulative count again: no increase
  m.ObserveWorkerWatchdogKills("a", 3);
  m.ObserveWorkerWatchdogKills("b", 1);
  v = Samples(Scrape(registry));
  EXPECT_EQ(v[R"(offloadd_watchdog_kills_total{process="executor"})"], 1);
  EXPECT_EQ(v[R"(offloadd_watchdog_kills_total{process="store"})"], 2);
  EXPECT_EQ(v[R"(offloadd_watchdog_kills_total{process="worker"})"], 4);
}

TEST(TrainMetricsTest, EvalAndProjectorCheckSeries) {
  prometheus::Registry registry;
  TrainMetrics m(registry);
  m.Observe("plain", Step(1));
  m.ObserveEval("a", {0, 3.5, 1000, 0.1});
  m.ObserveEval("a", {25, 2.75, 1000, 0.1});
  m.ObserveProjectorCheck("a", {1, 35, 34, 118.0, 3.0, 0.7});
  m.ObserveProjectorCheck("a", {51, 35, 0, 0.4, 0.0, 0.5});  // below the threshold: nothing learned
  std::map<std::string, double> v = Samples(Scrape(registry));
  EXPECT_EQ(v[R"(offloadd_train_eval_loss{job_id="a"})"], 2.75);
  EXPECT_EQ(v[R"(offloadd_train_eval_step{job_id="a"})"], 25);
  EXPECT_EQ(v[R"(offloadd_train_lsp_checks_total{job_id="a"})"], 2);
  EXPECT_EQ(v[R"(offloadd_train_lsp_switched_matrices_total{job_id="a"})"], 34);
  EXPECT_DOUBLE_EQ(v[R"(offloadd_train_lsp_check_seconds_total{job_id="a"})"], 1.2);
  EXPECT_EQ(v[R"(offloadd_train_lsp_bias{job_id="a",projectors="in_use"})"], 0.4);
  EXPECT_EQ(v[R"(offloadd_train_lsp_bias{job_id="a",projectors="learned"})"], 3.0);  // the last learned
  EXPECT_EQ(v.count(R"(offloadd_train_eval_loss{job_id="plain"})"), 0u);
  EXPECT_EQ(v.count(R"(offloadd_train_lsp_checks_total{job_id="plain"})"), 0u);
  m.ClearJob("a");
  const std::string text = Scrape(registry);
  EXPECT_EQ(text.find(R"(job_id="a")"), std::string::npos) << text;
}

// A run's first step carries the time to it and its set-up phases; they become
// gauges of the job (set again by a restarted run's first step) and go with the job's series.
TEST(TrainMetricsTest, TimeToFirstStepAndSetupPhases) {
  prometheus::Registry registry;
  TrainMetrics m(registry);
  m.Observe("plain", Step(2));  // not a first step: no set-up series
  trainer::StepStats first = Step(1);
  first.time_to_first_step_seconds = 21.5;
  first.setup_phase_seconds = {1.5, 0.25, 0.125, 0.5, 6.0, 0.75, 9.0, 2.5};
  // The arena populated beside the workers and the weights: the phases' start times say so.
  first.setup_phase_start_seconds = {0.0, 1.5, 1.75, 1.875, 2.375, 2.5, 3.25, 12.25};
  m.Observe("a", first);
  m.Observe("a", Step(2));  // later steps leave them
  std::map<std::string, double> v = Samples(Scrape(registry));
  EXPECT_EQ(v[R"(offloadd_train_time_to_first_step_seconds{job_id="a"})"], 21.5);
  EXPECT_EQ(v[R"(offloadd_train_setup_phase_seconds{job_id="a",phase="arena"})"], 6.0);
  EXPECT_EQ(v[R"(offloadd_train_setup_phase_seconds{job_id="a",phase="weights"})"], 9.0);
  EXPECT_EQ(v[R"(offloadd_train_setup_phase_seconds{job_id="a",phase="device"})"], 2.5);
  EXPECT_EQ(v[R"(offloadd_train_setup_phase_start_seconds{job_id="a",phase="arena"})"], 2.375);
  EXPECT_EQ(v[R"(offloadd_train_setup_phase_start_seconds{job_id="a",phase="weights"})"], 3.25);
  EXPECT_EQ(v.count(R"(offloadd_train_time_to_first_step_seconds{job_id="plain"})"), 0u);
  first.time_to_first_step_seconds = 12.0;  // a restarted executor's run
  m.Observe("a", first);
  v = Samples(Scrape(registry));
  EXPECT_EQ(v[R"(offloadd_train_time_to_first_step_seconds{job_id="a"})"], 12.0);
  m.ClearJob("a");
  const std::string text = Scrape(registry);
  EXPECT_EQ(text.find(R"(job_id="a")"), std::string::npos) << text;
}

TEST(TrainMetricsTest, JobsByStateZeroesStatesThatEmptied) {
  prometheus::Registry registry;
  TrainMetrics m(registry);
  m.SetJobsByState({{"RUNNING", 1}, {"QUEUED", 2}});
  m.SetJobsByState({{"SUCCEEDED", 1}, {"QUEUED", 1}});
  auto s = Samples(Scrape(registry));
  EXPECT_EQ(s[R"(offloadd_jobs{state="RUNNING"})"], 0);
  EXPECT_EQ(s[R"(offloadd_jobs{state="QUEUED"})"], 1);
  EXPECT_EQ(s[R"(offloadd_jobs{state="SUCCEEDED"})"], 1);
}

TEST(TrainMetricsTest, ExpositionPassesPromtool) {
  if (std::system("command -v promtool > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed (Debian package 'prometheus')";
  }
  prometheus::Registry registry;
  TrainMetrics::Options options;
  options.peak_flops = 989e12;
  TrainMetrics m(registry, options);
  m.SetJobsByState({{"RUNNING", 1}});
  trainer::StepStats first = Step(1);
  first.time_to_first_step_seconds = 20;
  first.setup_phase_seconds.assign(trainer::kSetupPhases.size(), 1.0);
  m.Observe("job-1", first);

  char path[] = "/tmp/offloadd-train-metrics-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << Scrape(registry);
  const std::string out = std::string(path) + ".out";
  // promtool exits non-zero and prints the problem on format errors and lint findings.
  const int rc = std::system(
      ("promtool check metrics < " + std::string(path) + " > " + out + " 2>&1").c_str());
  std::ifstream in(out);
  const std::string report((std::istreambuf_iterator<char>(in)), {});
  ::unlink(path);
  ::unlink(out.c_str());
  EXPECT_EQ(rc, 0) << report;
}

TEST(PeakFlopsTest, KnownGpusByTheNameCudaReports) {
  EXPECT_DOUBLE_EQ(KnownPeakBf16Flops("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_DOUBLE_EQ(KnownPeakBf16Flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_DOUBLE_EQ(KnownPeakBf16Flops("NVIDIA H100 NVL"), 835e12);
  EXPECT_DOUBLE_EQ(KnownPeakBf16Flops("NVIDIA H200"), 989.4e12);
  EXPECT_DOUBLE_EQ(KnownPeakBf16Flops("NVIDIA H200 NVL"), 835e12);
  EXPECT_DOUBLE_EQ(KnownPeakBf16Flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_DOUBLE_EQ(KnownPeakBf16Flops("NVIDIA GeForce GTX 1080"), 0);  // unknown: no MFU
}

// /metrics is unauthenticated; a listen address beyond loopback is warned.
TEST(MetricsListenWarningTest, WarnsBeyondLoopbackOnly) {
  for (const char* quiet : {"", "127.0.0.1:9464", "127.0.0.2:0", "localhost:9464", "[::1]:9464"}) {
    EXPECT_EQ(MetricsListenWarning(quiet), "") << quiet;
  }
  for (const char* open :
       {"0.0.0.0:9464", "[::]:9464", "10.1.2.3:9464", "metrics.example.com:9464"}) {
    const std::string w = MetricsListenWarning(open);
    EXPECT_NE(w.find(std::string("metrics.listen ") + open + " is not a loopback address"),
              std::string::npos)
        << w;
    EXPECT_NE(w.find("no authentication"), std::string::npos) << w;
  }
}

// No label of offloadd_job_info carries what a user wrote: only the job id and the GPUs.
TEST(TrainMetricsTest, JobInfoHasNoUserText) {
  prometheus::Registry registry;
  TrainMetrics m(registry);
  m.StartJob("job-7", "0");
  const std::string text = Scrape(registry);
  EXPECT_NE(text.find(R"(offloadd_job_info{gpus="0",job_id="job-7"} 1)"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("display_name"), std::string::npos) << text;
  EXPECT_EQ(text.find("model="), std::string::npos) << text;
}

}  // namespace
}  // namespace offloadd::daemon
