#include "trainer/node_profile.h"

#include <ATen/ATen.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "common/safe_path.h"
#include "common/units.h"
#include "engine/file_util.h"
#include "workers/adamw_kernel.h"

#if OFFLOADD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace offloadd::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown host";
  return buf;
}

// Runs fn(i, begin, end) over [0, n) split between `threads` threads.
template <typename Fn>
void Parallel(int threads, size_t n, Fn fn) {
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    const size_t begin = n * i / threads, end = n * (i + 1) / threads;
    pool.emplace_back([&fn, i, begin, end] { fn(i, begin, end); });
  }
  for (auto& t : pool) t.join();
}

// STREAM triad over 3 x 192 MiB of floats (far beyond any last-level cache), 8 passes per timed
// run so that starting the threads is noise (one pass is ~5 ms at 130 GB/s), best of 4.
double MeasureHostBandwidth(int threads) {
  constexpr int kPasses = 8;
  const size_t n = size_t{48} << 20;
  // Uninitialised, so that the measuring threads' first touch places the pages (NUMA).
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  Parallel(threads, n, [&](int, size_t lo, size_t hi) {  // first touch by the measuring threads
    for (size_t i = lo; i < hi; ++i) a[i] = 0, b[i] = 1, c[i] = 2;
  });
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
    Parallel(threads, n, [&](int, size_t lo, size_t hi) {
      float* __restrict pa = a.get();
      const float* __restrict pb = b.get();
      const float* __restrict pc = c.get();
      for (int pass = 0; pass < kPasses; ++pass) {
        for (size_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
      }
    });
    best = std::max(best, kPasses * 3.0 * 4.0 * static_cast<double>(n) / Since(t0));
  }
  return best;
}

// The fused AdamW kernel on 2^25 parameters (bf16 gradients and weights: 512 MiB of state and
// traffic like a real shard), each thread on its own slice, 4 passes per timed run (one pass is
// ~8 ms at 4 G params/s: starting 15 threads per pass cost ~10% of it, and the profile read 3.6
// against the worker pool's 4.3 G params/s on the H200 host), best of 3.
double MeasureAdamW(int threads, workers::KernelPath path) {
  constexpr int kPasses = 4;
  const size_t n = size_t{1} << 25;
  std::unique_ptr<float[]> master(new float[n]), m(new float[n]), v(new float[n]);
  std::unique_ptr<uint16_t[]> grad(new uint16_t[n]), weights(new uint16_t[n]);
  Parallel(threads, n, [&](int, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) {
      master[i] = 0.01f * static_cast<float>(i % 97);
      m[i] = v[i] = 0;
      grad[i] = 0x3c00 + static_cast<uint16_t>(i % 64);  // small positive bf16 values
      weights[i] = 0;
    }
  });
  workers::AdamWHyper h;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    Parallel(threads, n, [&](int, size_t lo, size_t hi) {
      workers::AdamWSpan s;
      s.grad = grad.get() + lo;
      s.grad_dtype = workers::GradDtype::kBf16;
      s.master = master.get() + lo;
      s.exp_avg = m.get() + lo;
      s.exp_avg_sq = v.get() + lo;
      s.weights = weights.get() + lo;
      s.weight_dtype = workers::WeightDtype::kBf16;
      s.n = hi - lo;
      workers::AdamWHyper hp = h;
      for (int pass = 0; pass < kPasses; ++pass) {
        hp.step = static_cast<uint64_t>(rep * kPasses + pass + 1);
        workers::FusedAdamW(s, hp, path);
      }
    });
    best = std::max(best, kPasses * static_cast<double>(n) / Since(t0));
  }
  return best;
}

// Pinned host <-> device copies of 256 MiB, each direction alone and both at once on two
// streams, best of 3 after a warm-up copy.
void MeasurePcie(c10::Device device, NodeProfile* p) {
#if OFFLOADD_WITH_CUDA
  const int64_t bytes = int64_t{256} << 20;
  const auto pinned = at::TensorOptions().dtype(at::kByte).pinned_memory(true);
  const auto on_device = at::TensorOptions().dtype(at::kByte).device(device);
  at::Tensor host_in = at::ones({bytes}, pinned), host_out = at::empty({bytes}, pinned);
  at::Tensor dev_in = at::empty({bytes}, on_device), dev_out = at::ones({bytes}, on_device);
  const c10::cuda::CUDAGuard guard(device);
  c10::cuda::CUDAStream up = c10::cuda::getStreamFromPool(false, device.index());
  c10::cuda::CUDAStream down = c10::cuda::getStreamFromPool(false, device.index());
  auto best_of = [&](bool h2d, bool d2h) {
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
      c10::cuda::device_synchronize();
      const auto t0 = Clock::now();
      if (h2d) {
        const c10::cuda::CUDAStreamGuard g(up);
        dev_in.copy_(host_in, /*non_blocking=*/true);
      }
      if (d2h) {
        const c10::cuda::CUDAStreamGuard g(down);
        host_out.copy_(dev_out, /*non_blocking=*/true);
      }
      up.synchronize();
      down.synchronize();
      if (rep > 0) best = std::min(best, Since(t0));  // rep 0 warms up
    }
    return static_cast<double>(bytes) * ((h2d ? 1 : 0) + (d2h ? 1 : 0)) / best;
  };
  p->h2d_bytes_per_s = best_of(true, false);
  p->d2h_bytes_per_s = best_of(false, true);
  p->both_bytes_per_s = best_of(true, true);
#else
  (void)device;
  (void)p;
#endif
}


}  // namespace

StatusOr<NodeProfile> LoadOrMeasureNodeProfile(const std::string& dir, int threads,
                                               const std::string& kernel, c10::Device device,
                                               bool* cached, std::string* cache_problem) {
  if (threads < 1) return InvalidArgumentError("node profile: threads must be >= 1");
  ASSIGN_OR_RETURN(workers::KernelChoice choice, workers::ResolveKernelPath(kernel));
  const std::string path_name(workers::KernelPathName(choice.path));
  std::ostringstream key;
  key << HostName() << " | " << CpuModel() << " | " << UsableCores() << " cores | AdamW "
      << threads << " threads " << path_name << " | ";
#if OFFLOADD_WITH_CUDA
  if (device.is_cuda()) {
    key << at::cuda::getDeviceProperties(device.index() < 0 ? 0 : device.index())->name;
  } else {
    key << "no GPU";
  }
#else
  key << "no GPU";
#endif
  const std::string file = dir.empty() ? "" : dir + "/" + kNodeProfileFile;
  *cached = false;
  cache_problem->clear();
  if (!file.empty()) {
    // Absent, unreadable, corrupt or measured under another key: measured again (the cache only
    // saves time).
    auto p = ReadNodeProfile(file);
    if (p.ok() && p->key == key.str()) {
      *cached = true;
      return *p;
    }
  }
  NodeProfile p;
  p.key = key.str();
  const auto t0 = Clock::now();
  p.host_bytes_per_s = MeasureHostBandwidth(UsableCores());
  p.threads = threads;
  p.kernel = path_name;
  p.cpu_params_per_s = MeasureAdamW(threads, choice.path);
  // The AdamW kernel runs at the memory roofline, so its own traffic (28 B per parameter) is a
  // bandwidth the host sustains too; a plain triad understates it on the H200 hosts (86 against
  // the 123-128 GB/s that AdamW-shaped traffic reached there). The larger of the two counts.
  p.host_bytes_per_s = std::max(p.host_bytes_per_s, 28.0 * p.cpu_params_per_s);
  if (device.is_cuda()) MeasurePcie(device, &p);
  p.measure_seconds = Since(t0);
  p.measured_at = NowUtcIso8601();
  if (!file.empty()) {
    // The cache only saves time: a job does not fail because it cannot be written.
    Status st = engine::MakeDirs(dir);
    if (st.ok()) st = WriteFileAtomically(file, NodeProfileJson(p));
    if (!st.ok()) *cache_problem = "not cached: " + std::string(st.message());
  }
  return p;
}

std::string DescribeNodeProfile(const NodeProfile& p) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "host memory %.1f GB/s, AdamW %.2f G params/s (%d threads, %s), PCIe H2D %.1f / "
                "D2H %.1f / both %.1f GB/s (measured %s in %.1f s)",
                p.host_bytes_per_s / 1e9, p.cpu_params_per_s / 1e9, p.threads, p.kernel.c_str(),
                p.h2d_bytes_per_s / 1e9, p.d2h_bytes_per_s / 1e9, p.both_bytes_per_s / 1e9,
                p.measured_at.c_str(), p.measure_seconds);
  return buf;
}

}  // namespace offloadd::trainer
