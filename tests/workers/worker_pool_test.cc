// WorkerPool against the real offloadd-worker binary: results equal to running the kernel in
// process, bit for bit, also when a worker is killed mid-command (fault-injection seam or an
// external SIGKILL); back-pressure through tiny rings; bad commands answered with errors.
#include "workers/worker_pool.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "ipc/liveness.h"
#include "workers/adamw_kernel_impl.h"

namespace offloadd::workers {
namespace {

std::string WorkerBinary() {
  if (const char* dir = std::getenv("OFFLOADD_BINARY_DIR")) {
    return std::string(dir) + "/workers/offloadd-worker";
  }
  // <build>/tests/workers/workers_test -> <build>/workers/offloadd-worker
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
          "../../workers/offloadd-worker")
      .string();
}

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float Uniform(uint64_t seed) {
  return static_cast<float>(Mix(seed) >> 40) / float(1 << 24) * 2 - 1;
}

// A few layers of AdamW state in a shared arena.
class Model {
 public:
  struct Layer {
    uint64_t n;
    ipc::Region grad, master, exp_avg, exp_avg_sq, weights, counters;
  };

  explicit Model(std::vector<uint64_t> sizes) {
    uint64_t bytes = 64 << 20;
    for (uint64_t n : sizes) bytes += n * 16 + 8 * 4096;
    segment_ = std::move(ipc::SharedSegment::Create(bytes)).value();
    arena_ = std::move(ipc::Arena::Format(&segment_)).value();
    for (size_t l = 0; l < sizes.size(); ++l) {
      const uint64_t n = sizes[l];
      const std::string p = "L" + std::to_string(l) + ".";
      auto alloc = [&](const char* name, ipc::RegionKind kind, uint64_t b) {
        return std::move(arena_.Allocate(p + name, kind, b)).value();
      };
      Layer L{n,
              alloc("grad", ipc::RegionKind::kGradStaging, n * 2),
              alloc("master", ipc::RegionKind::kMaster, n * 4),
              alloc("exp_avg", ipc::RegionKind::kExpAvg, n * 4),
              alloc("exp_avg_sq", ipc::RegionKind::kExpAvgSq, n * 4),
              alloc("weights", ipc::RegionKind::kParamStaging, n * 2),
              alloc("counters", ipc::RegionKind::kControl, CountersBytes(n))};
      float* master = arena_.At<float>(L.master.offset);
      for (uint64_t i = 0; i < n; ++i) master[i] = Uniform(l * 1000003 + i);
      layers_.push_back(L);
    }
  }

  void FillGrads(uint64_t step) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      uint16_t* g = arena_.At<uint16_t>(layers_[l].grad.offset);
      for (uint64_t i = 0; i < layers_[l].n; ++i) {
        g[i] = internal::FloatToBf16(Uniform((step << 40) ^ (l << 32) ^ i) * 0.01f);
      }
    }
  }

  AdamWHyper Hyper(uint64_t step) const {
    return {.lr = 1e-3 / static_cast<double>(step),
            .beta1 = 0.9,
            .beta2 = 0.999,
            .eps = 1e-8,
            .weight_decay = 0.01,
            .step = step,
            .grad_scale = 1.0f};
  }

  ipc::CommandRecord Command(size_t l, uint64_t step, uint64_t id) const {
    const Layer& L = layers_[l];
    const AdamWHyper h = Hyper(step);
    AdamWCommand c{L.n,
                   L.grad.offset,
                   L.master.offset,
                   L.exp_avg.offset,
                   L.exp_avg_sq.offset,
                   L.weights.offset,
                   L.counters.offset,
                   step,
                   h.lr,
                   h.beta1,
                   h.beta2,
                   h.eps,
                   h.weight_decay,
                   h.grad_scale,
                   static_cast<uint32_t>(l)};
    ipc::CommandRecord r{};
    r.kind = static_cast<uint32_t>(CommandKind::kAdamW);
    r.id = id;
    r.Pack(c);
    return r;
  }

  // The same steps with the kernel called in this process on whole layers.
  void ReferenceStep(uint64_t step) {
    FillGrads(step);
    for (const Layer& L : layers_) {
      AdamWSpan s{arena_.At<void>(L.grad.offset),
                  GradDtype::kBf16,
                  arena_.At<float>(L.master.offset),
                  arena_.At<float>(L.exp_avg.offset),
                  arena_.At<float>(L.exp_avg_sq.offset),
                  arena_.At<void>(L.weights.offset),
                  WeightDtype::kBf16,
                  L.n};
      FusedAdamW(s, Hyper(step), BestPath());
    }
  }

  std::vector<uint8_t> State() const {
    std::vector<uint8_t> out;
    for (const Layer& L : layers_) {
      for (const ipc::Region* r : {&L.master, &L.exp_avg, &L.exp_avg_sq, &L.weights}) {
        const uint8_t* p = arena_.At<uint8_t>(r->offset);
        out.insert(out.end(), p, p + r->size);
      }
    }
    return out;
  }

  ipc::SharedSegment& segment() { return segment_; }
  ipc::Arena& arena() { return arena_; }
  const std::vector<Layer>& layers() const { return layers_; }

 private:
  ipc::SharedSegment segment_;
  ipc::Arena arena_;
  std::vector<Layer> layers_;
};

const std::vector<uint64_t> kSizes = {100'003, 8'192, 40'000};

std::vector<uint8_t> Reference(int steps) {
  Model m(kSizes);
  for (int s = 1; s <= steps; ++s) m.ReferenceStep(s);
  return m.State();
}

WorkerPoolOptions Options(uint32_t processes, uint32_t threads) {
  WorkerPoolOptions o;
  o.worker_binary = WorkerBinary();
  o.processes = processes;
  o.threads_per_process = threads;
  return o;
}

// Runs `steps` steps through the pool; every command must succeed.
void Train(Model* m, WorkerPool* pool, int steps, uint64_t* next_id) {
  for (int s = 1; s <= steps; ++s) {
    m->FillGrads(s);
    std::set<uint64_t> ids;
    for (size_t l = 0; l < m->layers().size(); ++l) {
      ids.insert(*next_id);
      ASSERT_TRUE(pool->Submit(m->Command(l, s, (*next_id)++)).ok());
    }
    while (!ids.empty()) {
      auto c = pool->WaitCompletion(60000);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      ASSERT_EQ(c->status_code, 0) << c->message;
      ASSERT_EQ(ids.erase(c->id), 1u) << "completion " << c->id << " delivered twice or unknown";
    }
  }
}

TEST(WorkerPoolTest, MatchesInProcessKernelBitForBit) {
  Model m(kSizes);
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), Options(2, 2));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  uint64_t id = 1;
  Train(&m, pool->get(), 3, &id);
  EXPECT_EQ(m.State(), Reference(3));
  const WorkerPoolMetrics metrics = (*pool)->Metrics();
  uint64_t params = 0, commands = 0;
  for (const auto& w : metrics.workers) {
    params += w.params_updated_total;
    commands += w.commands_total;
    EXPECT_GT(w.pid, 0);
    EXPECT_EQ(w.queue_depth, 0u);
  }
  EXPECT_EQ(params, 3 * (100'003u + 8'192u + 40'000u));
  EXPECT_EQ(commands, 9u);
  EXPECT_EQ(metrics.restarts_total, 0u);
  uint64_t latency_count = 0;
  for (uint64_t c : metrics.latency_counts) latency_count += c;
  EXPECT_EQ(latency_count, 9u);
  EXPECT_TRUE((*pool)->Shutdown().ok());
}

TEST(WorkerPoolTest, ReplayingADoneCommandChangesNothing) {
  Model m({20'000});
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), Options(1, 2));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  m.FillGrads(1);
  ASSERT_TRUE((*pool)->Submit(m.Command(0, 1, 1)).ok());
  auto first = (*pool)->WaitCompletion(60000);
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->status_code, 0);
  EXPECT_EQ(first->chunks_applied, NumChunks(20'000));
  const auto after_once = m.State();
  ASSERT_TRUE((*pool)->Submit(m.Command(0, 1, 2)).ok());
  auto again = (*pool)->WaitCompletion(60000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->status_code, 0);
  EXPECT_EQ(again->chunks_applied, 0u);
  EXPECT_EQ(again->chunks_skipped, NumChunks(20'000));
  EXPECT_EQ(again->grad_sq_norm, first->grad_sq_norm);  // the norm is still reported
  EXPECT_EQ(m.State(), after_once);
}

class CrashTest : public ::testing::TestWithParam<CrashPoint> {};

TEST_P(CrashTest, WorkerKilledMidCommandGivesTheSameResult) {
  Model m(kSizes);
  WorkerPoolOptions o = Options(1, 2);
  o.crash_point = GetParam();
  o.crash_after_chunks = 90;  // step 2 (73 chunks per step), inside layer 0
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), o);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  const pid_t first_pid = (*pool)->Pids()[0];
  uint64_t id = 1;
  Train(&m, pool->get(), 3, &id);
  const WorkerPoolMetrics metrics = (*pool)->Metrics();
  EXPECT_EQ(metrics.restarts_total, 1u);
  EXPECT_GE(metrics.replayed_commands_total, 1u);
  EXPECT_NE((*pool)->Pids()[0], first_pid);
  EXPECT_EQ(m.State(), Reference(3));
}

INSTANTIATE_TEST_SUITE_P(AllPoints, CrashTest,
                         ::testing::Values(CrashPoint::kAfterKernel, CrashPoint::kMidCopy,
                                           CrashPoint::kAfterCommit));

// Waits until worker 0 runs under a pid other than `old` (restarted) or is marked failed.
pid_t WaitForRestart(WorkerPool* pool, pid_t old) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    const WorkerPoolMetrics m = pool->Metrics();
    if (m.workers[0].failed) return 0;
    if (m.workers[0].pid > 0 && m.workers[0].pid != old) return m.workers[0].pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return -1;
}

TEST(WorkerPoolTest, ExternalSigkillWhileBusyGivesTheSameResult) {
  Model m(kSizes);
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), Options(2, 1));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  uint64_t id = 1;
  pid_t killed = 0;
  std::thread killer([&] {
    // Kill worker 0 as soon as it has completed something: it is then mid-way through its queue.
    while ((*pool)->Metrics().workers[0].commands_total == 0) std::this_thread::yield();
    killed = (*pool)->Pids()[0];
    ::kill(killed, SIGKILL);
  });
  Train(&m, pool->get(), 3, &id);
  killer.join();
  // When the kill lands after worker 0's last command, training can finish before the pool has
  // reaped and restarted it (CI saw restarts_total 0 read 30 ms before the restart): wait for it.
  ASSERT_GT(WaitForRestart(pool->get(), killed), 0);
  EXPECT_EQ((*pool)->Metrics().restarts_total, 1u);
  EXPECT_EQ(m.State(), Reference(3));
}

// A stopped worker (SIGSTOP: no death for its pidfd to show, as a worker wedged
// in the kernel or deadlocked) is killed once its oldest command is past the liveness deadline,
// restarted and replayed: the result is the uninterrupted one, bit for bit.
TEST(WorkerPoolTest, AStoppedWorkerIsKilledByTheLivenessDeadlineAndReplayed) {
  Model m(kSizes);
  ipc::SetLivenessPolicy(/*floor_seconds=*/0.3, /*factor=*/10);
  ipc::SetLivenessRates(/*worker_params_per_second=*/1e9, 0);
  const uint64_t kills_before = ipc::WatchdogKills("worker");
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), Options(2, 1));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  const pid_t stopped = (*pool)->Pids()[0];
  ASSERT_EQ(::kill(stopped, SIGSTOP), 0);
  uint64_t id = 1;
  const auto t0 = std::chrono::steady_clock::now();
  Train(&m, pool->get(), 3, &id);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  ipc::SetLivenessPolicy(0, 10);  // the other tests: no deadlines
  EXPECT_EQ(ipc::WatchdogKills("worker") - kills_before, 1u);
  EXPECT_EQ((*pool)->Metrics().restarts_total, 1u);
  EXPECT_NE((*pool)->Pids()[0], stopped);
  EXPECT_EQ(m.State(), Reference(3));
}

TEST(LivenessPolicyTest, DeadlineIsTheFloorOrTheFactorTimesTheExpectedTime) {
  const ipc::LivenessPolicy off{};
  EXPECT_EQ(off.DeadlineSeconds(1e9), 0);  // no floor: no deadline
  const ipc::LivenessPolicy l{.floor_seconds = 2, .factor = 10, .work_per_second = 1e8};
  EXPECT_EQ(l.DeadlineSeconds(1e6), 2);    // 10 ms expected: the floor
  EXPECT_EQ(l.DeadlineSeconds(1e9), 100);  // 10 s expected, x 10
  const ipc::LivenessPolicy unknown{.floor_seconds = 2, .factor = 10, .work_per_second = 0};
  EXPECT_EQ(unknown.DeadlineSeconds(1e9), 2);  // no profile: the floor
}

TEST(WorkerPoolTest, AWorkerThatCompletesWorkBetweenKillsIsNeverAbandoned) {
  // max_restarts bounds a crash loop (consecutive crashes with no completed command between),
  // not the crashes of a job's lifetime: four kills, each after a completed step, with
  // max_restarts = 1 still give the uninterrupted result.
  Model m(kSizes);
  WorkerPoolOptions o = Options(1, 1);
  o.max_restarts = 1;
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), o);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  uint64_t id = 1;
  for (int s = 1; s <= 5; ++s) {
    m.FillGrads(s);
    for (size_t l = 0; l < m.layers().size(); ++l) ASSERT_TRUE((*pool)->Submit(m.Command(l, s, id++)).ok());
    for (size_t l = 0; l < m.layers().size(); ++l) {
      auto c = (*pool)->WaitCompletion(60000);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      ASSERT_EQ(c->status_code, 0) << "step " << s << ": " << c->message;
    }
    if (s == 5) break;
    const pid_t pid = (*pool)->Pids()[0];
    ::kill(pid, SIGKILL);
    ASSERT_GT(WaitForRestart(pool->get(), pid), 0) << "kill " << s << ": worker not restarted";
  }
  EXPECT_EQ((*pool)->Metrics().restarts_total, 4u);
  EXPECT_FALSE((*pool)->Metrics().workers[0].failed);
  EXPECT_EQ(m.State(), Reference(5));
}

TEST(WorkerPoolTest, ConsecutiveCrashesWithoutProgressAbandonTheWorker) {
  Model m({1'000});
  WorkerPoolOptions o = Options(1, 1);
  o.max_restarts = 2;
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), o);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  pid_t pid = (*pool)->Pids()[0];
  for (int k = 1; k <= 2; ++k) {  // two crashes in a row are restarted
    ::kill(pid, SIGKILL);
    pid = WaitForRestart(pool->get(), pid);
    ASSERT_GT(pid, 0) << "crash " << k << " of 2 should be restarted";
  }
  ::kill(pid, SIGKILL);  // the third in a row, with nothing completed between, is a crash loop
  EXPECT_EQ(WaitForRestart(pool->get(), pid), 0);
  m.FillGrads(1);
  EXPECT_EQ((*pool)->Submit(m.Command(0, 1, 1)).code(), StatusCode::kUnavailable);
}

TEST(WorkerPoolTest, FullQueuesApplyBackPressureWithoutLoss) {
  Model m({1'000});
  WorkerPoolOptions o = Options(1, 1);
  o.queue_capacity = 2;
  o.max_outstanding = 3;
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), o);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  // Norm-only commands: read-only, so any number of them may be queued.
  const auto& L = m.layers()[0];
  constexpr int kCommands = 500;
  std::thread producer([&] {
    for (int i = 0; i < kCommands; ++i) {
      ipc::CommandRecord r{};
      r.kind = static_cast<uint32_t>(CommandKind::kGradNorm);
      r.id = 1000 + i;
      r.Pack(GradNormCommand{L.n, L.grad.offset, 0, 0});
      ASSERT_TRUE((*pool)->Submit(r).ok());
      EXPECT_LE((*pool)->Metrics().workers[0].queue_depth, 3u);
    }
  });
  std::set<uint64_t> seen;
  for (int i = 0; i < kCommands; ++i) {
    auto c = (*pool)->WaitCompletion(60000);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->status_code, 0);
    EXPECT_TRUE(seen.insert(c->id).second);
  }
  producer.join();
  EXPECT_EQ(seen.size(), size_t{kCommands});
  EXPECT_EQ(*seen.begin(), 1000u);
  EXPECT_EQ(*seen.rbegin(), 1000u + kCommands - 1);
}

TEST(WorkerPoolTest, BadCommandsGetErrorsAndTheWorkerSurvives) {
  Model m({10'000});
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), Options(1, 1));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  const pid_t pid = (*pool)->Pids()[0];
  auto expect_error = [&](const ipc::CommandRecord& r, StatusCode code, const char* text) {
    ASSERT_TRUE((*pool)->Submit(r).ok());
    auto c = (*pool)->WaitCompletion(60000);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->status_code, static_cast<int32_t>(code)) << c->message;
    EXPECT_NE(std::string(c->message).find(text), std::string::npos) << c->message;
  };
  ipc::CommandRecord r = m.Command(0, 1, 1);
  auto c = r.Unpack<AdamWCommand>();
  c.master_offset = m.segment().total_size() - 16;  // outside every region
  r.Pack(c);
  expect_error(r, StatusCode::kOutOfRange, "master");
  expect_error(m.Command(0, 3, 2), StatusCode::kFailedPrecondition, "in order");  // step 3 before 1
  r = m.Command(0, 1, 3);
  c = r.Unpack<AdamWCommand>();
  c.beta2 = 1.0;
  r.Pack(c);
  expect_error(r, StatusCode::kInvalidArgument, "beta2");
  r.kind = 99;
  expect_error(r, StatusCode::kInvalidArgument, "unknown command kind");
  EXPECT_EQ((*pool)->Pids()[0], pid);
  EXPECT_EQ((*pool)->Metrics().failed_commands_total, 4u);
}

TEST(WorkerPoolTest, AbandonedWorkerRollsBackAndFailsItsCommands) {
  Model m({50'000});
  const auto before = m.State();
  WorkerPoolOptions o = Options(1, 1);
  o.max_restarts = 0;
  o.crash_point = CrashPoint::kAfterKernel;
  o.crash_after_chunks = 0;
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), o);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  m.FillGrads(1);
  ASSERT_TRUE((*pool)->Submit(m.Command(0, 1, 7)).ok());
  auto c = (*pool)->WaitCompletion(60000);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->id, 7u);
  EXPECT_EQ(c->status_code, static_cast<int32_t>(StatusCode::kUnavailable));
  EXPECT_TRUE((*pool)->Metrics().workers[0].failed);
  EXPECT_EQ((*pool)->Submit(m.Command(0, 1, 8)).code(), StatusCode::kUnavailable);
  // The worker died before its first chunk reached the shared state: master/exp_avg/exp_avg_sq
  // are unchanged (only the derived bf16 weights of that chunk were rewritten).
  const auto after = m.State();
  const auto& L = m.layers()[0];
  EXPECT_EQ(std::memcmp(after.data(), before.data(), L.n * 12), 0);
}

TEST(WorkerPoolTest, ANewPoolReusesTheArena) {
  Model m(kSizes);
  uint64_t id = 1;
  {
    auto pool = WorkerPool::Start(&m.segment(), &m.arena(), Options(1, 2));
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    Train(&m, pool->get(), 1, &id);
  }
  // Same rings, counters and redo slots; step 2 continues where step 1 ended.
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), Options(1, 1));
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  m.FillGrads(2);
  std::set<uint64_t> ids;
  for (size_t l = 0; l < m.layers().size(); ++l) {
    ids.insert(id);
    ASSERT_TRUE((*pool)->Submit(m.Command(l, 2, id++)).ok());
  }
  for (size_t l = 0; l < m.layers().size(); ++l) {
    auto c = (*pool)->WaitCompletion(60000);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->status_code, 0) << c->message;
  }
  EXPECT_EQ(m.State(), Reference(2));
  pool->reset();
  auto bigger = WorkerPool::Start(&m.segment(), &m.arena(), Options(1, 4));
  ASSERT_FALSE(bigger.ok());
  EXPECT_EQ(bigger.status().code(), StatusCode::kFailedPrecondition);
}

TEST(WorkerPoolTest, WorkersDieWithTheDaemon) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const pid_t daemon = fork();
  ASSERT_GE(daemon, 0);
  if (daemon == 0) {  // a stand-in daemon: start a pool, report its workers, die hard
    close(pipefd[0]);
    Model m({1'000});
    auto pool = WorkerPool::Start(&m.segment(), &m.arena(), Options(2, 1));
    if (!pool.ok()) _exit(1);
    for (pid_t pid : (*pool)->Pids()) {
      if (write(pipefd[1], &pid, sizeof(pid)) != sizeof(pid)) _exit(2);
    }
    close(pipefd[1]);
    raise(SIGKILL);
  }
  close(pipefd[1]);
  std::vector<pid_t> workers;
  pid_t pid;
  while (read(pipefd[0], &pid, sizeof(pid)) == sizeof(pid)) workers.push_back(pid);
  close(pipefd[0]);
  int status = 0;
  ASSERT_EQ(waitpid(daemon, &status, 0), daemon);
  ASSERT_EQ(workers.size(), 2u) << "stand-in daemon failed to start its pool";
  for (pid_t w : workers) {
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, w, 0));
    if (fd < 0) {
      EXPECT_EQ(errno, ESRCH);  // already gone and reaped
      continue;
    }
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 30000), 1) << "worker " << w << " outlived its daemon";
    close(fd);
  }
}

TEST(WorkerPoolTest, WorkerRefusesACorruptArena) {
  Model m({1'000});
  // Break the arena header's magic (first 8 bytes of the data area) after the daemon opened it.
  uint8_t* arena_header = m.segment().base() + m.segment().header().data_offset;
  arena_header[0] ^= 0xff;
  auto pool = WorkerPool::Start(&m.segment(), &m.arena(), Options(1, 1));
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pool.status().message().find("bad arena magic"), std::string::npos)
      << pool.status().ToString();
}

TEST(WorkerPoolTest, StartFailuresAreClear) {
  Model m({1'000});
  WorkerPoolOptions o = Options(1, 1);
  o.worker_binary = "/nonexistent/offloadd-worker";
  auto missing = WorkerPool::Start(&m.segment(), &m.arena(), o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("not executable"), std::string::npos);
  o.worker_binary = "/bin/false";
  auto wrong = WorkerPool::Start(&m.segment(), &m.arena(), o);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("exited with code 1"), std::string::npos)
      << wrong.status().ToString();
  o = Options(0, 1);
  EXPECT_EQ(WorkerPool::Start(&m.segment(), &m.arena(), o).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offloadd::workers
