// HostOptimizer with the real offloadd-worker and offloadd-store binaries: a step that fails
// (non-finite gradient norm under clipping, a store killed between steps) must reach every wait
// of the step loop with that error, never leave one blocked (issue #18, defects 1 and 2). Each
// wait runs under a watchdog: a wait that does not return within kBound fails the test and ends
// the process, so a regression shows as a failure, not as a hung CI job. POSIX calls, not
// std::filesystem: this binary links LibTorch (docs/DEVELOPING.md, hazards).
#include "trainer/host_optimizer.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <limits>
#include <sstream>
#include <string>

#include "engine/file_util.h"

namespace offloadd::trainer {
namespace {

constexpr auto kBound = std::chrono::seconds(20);

std::string BinaryDir() {
  if (const char* dir = std::getenv("OFFLOADD_BINARY_DIR")) return dir;
  // <build>/tests/trainer/host_optimizer_test -> <build>
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string path(exe, n > 0 ? static_cast<size_t>(n) : 0);
  return path.substr(0, path.rfind('/')) + "/../..";
}

// Runs `wait` on another thread; a wait still blocked after kBound fails the test and exits.
template <typename F>
auto Bounded(const char* what, F wait) {
  auto f = std::async(std::launch::async, wait);
  if (f.wait_for(kBound) != std::future_status::ready) {
    ADD_FAILURE() << what << " still blocked after " << kBound.count() << " s";
    std::fflush(nullptr);
    std::_Exit(1);  // the blocked thread cannot be joined
  }
  return f.get();
}

// The pid of this process's child running `name` (via /proc/self/task/*/children).
pid_t ChildNamed(const std::string& name) {
  DIR* tasks = ::opendir("/proc/self/task");
  if (tasks == nullptr) return -1;
  pid_t found = -1;
  while (dirent* e = ::readdir(tasks)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream children(std::string("/proc/self/task/") + e->d_name + "/children");
    for (pid_t pid; found < 0 && children >> pid;) {
      std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
      std::string c;
      if (std::getline(comm, c) && c == name) found = pid;
    }
  }
  ::closedir(tasks);
  return found;
}

class HostOptimizerTest : public ::testing::Test {
 protected:
  HostOptimizerOptions Options(StateTier tier) {
    HostOptimizerOptions o;
    o.block_elements = {3000, 5000, 2000};
    o.optim.max_grad_norm = 1.0;
    o.tier = tier;
    o.worker_binary = BinaryDir() + "/workers/offloadd-worker";
    o.store_binary = BinaryDir() + "/storage/offloadd-store";
    if (tier == StateTier::kNvme) {
      const char* tmp = std::getenv("TMPDIR");
      dir_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/host_optimizer_test." +
             std::to_string(::getpid());
      o.nvme_dirs = {dir_};
    }
    return o;
  }
  void TearDown() override {
    if (!dir_.empty()) {
      EXPECT_TRUE(engine::RemoveTree(dir_).ok());
    }
  }

  static std::unique_ptr<HostOptimizer> Make(const HostOptimizerOptions& o) {
    auto h = HostOptimizer::Create(o);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return nullptr;
    Status init = (*h)->Initialize([&](int b, float* master) {
      for (uint64_t i = 0; i < o.block_elements[b]; ++i) master[i] = 0.01f * static_cast<float>(i % 7);
      return OkStatus();
    });
    EXPECT_TRUE(init.ok()) << init.ToString();
    return std::move(*h);
  }

  // One step as the trainer's loop drives it: gradients of every block in reverse order, then the
  // step is closed; `fill` writes each block's fp32 gradients.
  static void Step(HostOptimizer* h, uint64_t step, float value) {
    ASSERT_TRUE(h->BeginStep(step, 1e-3).ok());
    for (int b = h->num_blocks() - 1; b >= 0; --b) {
      ASSERT_TRUE(Bounded("WaitStagingFree", [&] { return h->WaitStagingFree(b); }).ok());
      float* g = static_cast<float*>(h->grad_staging(b));
      for (uint64_t i = 0; i < h->elements(b); ++i) g[i] = value;
      ASSERT_TRUE(h->GradsReady(b, 0, nullptr).ok());
    }
    ASSERT_TRUE(h->FinishStepAsync().ok());
  }

  std::string dir_;
};

TEST_F(HostOptimizerTest, HealthyStepsUpdateEveryBlock) {
  auto h = Make(Options(StateTier::kNvme));
  ASSERT_TRUE(h);
  for (uint64_t s = 1; s <= 2; ++s) {
    Step(h.get(), s, 0.5f);
    for (int b = 0; b < h->num_blocks(); ++b) {
      Status st = Bounded("WaitUpdated", [&] { return h->WaitUpdated(b, s); });
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(s); });
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->skipped);
  }
}

// Defect 1: NaN gradients with clipping. The next forward waits for the blocks' update of the
// failed step (WaitUpdated); before the fix only WaitFinished saw the error and this wait hung.
TEST_F(HostOptimizerTest, NonFiniteNormFailsEveryWaitOfTheStep) {
  for (StateTier tier : {StateTier::kCpu, StateTier::kNvme}) {
    auto h = Make(Options(tier));
    ASSERT_TRUE(h);
    Step(h.get(), 1, std::numeric_limits<float>::quiet_NaN());
    Status st = Bounded("WaitUpdated", [&] { return h->WaitUpdated(0, 1); });
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
    EXPECT_NE(st.message().find("gradient norm is not finite (nan); step 1 was not applied"),
              std::string::npos)
        << st.ToString();
    auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(1); });
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_FALSE(h->BeginStep(2, 1e-3).ok());  // the optimizer stays failed
  }
}

// fp16 loss scaling: the same non-finite norm is an overflow; the step is skipped, not failed.
TEST_F(HostOptimizerTest, NonFiniteNormSkipsTheStepWithLossScaling) {
  HostOptimizerOptions o = Options(StateTier::kCpu);
  o.skip_nonfinite = true;
  auto h = Make(o);
  ASSERT_TRUE(h);
  Step(h.get(), 1, std::numeric_limits<float>::infinity());
  EXPECT_TRUE(Bounded("WaitUpdated", [&] { return h->WaitUpdated(0, 1); }).ok());
  auto r = Bounded("WaitFinished", [&] { return h->WaitFinished(1); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->skipped);
  EXPECT_EQ(r->adam_step, 0u);
}

// Defect 2: the store dies while the step loop computes (no store I/O in flight); with clipping
// the updates then run in FinishStep, whose first read from the store finds it dead.
TEST_F(HostOptimizerTest, KilledStoreFailsEveryWaitNamingTheStore) {
  auto h = Make(Options(StateTier::kNvme));
  ASSERT_TRUE(h);
  Step(h.get(), 1, 0.5f);
  ASSERT_TRUE(Bounded("WaitFinished", [&] { return h->WaitFinished(1); }).ok());
  const pid_t store = ChildNamed("offloadd-store");
  ASSERT_GT(store, 0);
  ASSERT_EQ(::kill(store, SIGKILL), 0);
  Step(h.get(), 2, 0.5f);
  Status st = Bounded("WaitUpdated", [&] { return h->WaitUpdated(0, 2); });
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("offloadd-store (pid " + std::to_string(store) +
                              ") died: killed by signal 9"),
            std::string::npos)
      << st.ToString();
  EXPECT_FALSE(Bounded("WaitFinished", [&] { return h->WaitFinished(2); }).ok());
  Bounded("destruction", [&] {
    h.reset();
    return 0;
  });
}

// The store stops answering (SIGSTOP) and then the optimizer is destroyed, as a failed or
// cancelled job does: destruction must not wait on the store for ever.
TEST_F(HostOptimizerTest, DestructionIsBoundedWithAStoppedStore) {
  auto h = Make(Options(StateTier::kNvme));
  ASSERT_TRUE(h);
  const pid_t store = ChildNamed("offloadd-store");
  ASSERT_GT(store, 0);
  ASSERT_EQ(::kill(store, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  Bounded("destruction", [&] {
    h.reset();
    return 0;
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("destroyed in %.1f s with the store stopped\n", s);
  EXPECT_EQ(::kill(store, 0), -1);  // killed and reaped
}

}  // namespace
}  // namespace offloadd::trainer
