// Shared by the HostOptimizer tests (host_optimizer_test.cc, nvme_state_tier_weights_test.cc): the
// fixture, bounded waits and the lookup of a child process by name.
#ifndef OFFLOADD_TESTS_TRAINER_HOST_OPTIMIZER_TESTLIB_H_
#define OFFLOADD_TESTS_TRAINER_HOST_OPTIMIZER_TESTLIB_H_

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <string>

#include "common/file.h"
#include "trainer/pipeline/host_optimizer.h"

namespace offloadd::trainer {

inline constexpr auto kBound = std::chrono::seconds(20);

inline std::string BinaryDir() {
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
inline pid_t ChildNamed(const std::string& name) {
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
      EXPECT_TRUE(RemoveTree(dir_).ok());
    }
  }

  static std::unique_ptr<HostOptimizer> Make(const HostOptimizerOptions& o) {
    auto h = HostOptimizer::Create(o);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return nullptr;
    Status init = (*h)->Initialize([&](int b, float* master) {
      for (uint64_t i = 0; i < o.block_elements[b]; ++i)
        master[i] = 0.01f * static_cast<float>(i % 7);
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

}  // namespace offloadd::trainer

#endif  // OFFLOADD_TESTS_TRAINER_HOST_OPTIMIZER_TESTLIB_H_
