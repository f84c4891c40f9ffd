#include "trainer/plan/node_profile.h"

#include <ATen/ATen.h>
#include <sched.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "common/file.h"
#include "common/file_identity.h"
#include "common/safe_path.h"
#include "common/units.h"
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
double MeasureAdamW(int threads, workers::KernelPath path, size_t n = size_t{1} << 25) {
  constexpr int kPasses = 4;
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

#if OFFLOADD_WITH_CUDA
// 256 MiB pinned host buffers and device buffers, one per PCIe direction, copied on two streams
// of their own: what MeasurePcie times and MeasureAdamWDuringDma runs beside the update.
struct CopyPair {
  static constexpr int64_t kBytes = int64_t{256} << 20;
  explicit CopyPair(c10::Device device)
      : host_in(at::ones({kBytes}, Pinned())),
        host_out(at::empty({kBytes}, Pinned())),
        dev_in(at::empty({kBytes}, at::TensorOptions().dtype(at::kByte).device(device))),
        dev_out(at::ones({kBytes}, at::TensorOptions().dtype(at::kByte).device(device))),
        guard(device),
        up(c10::cuda::getStreamFromPool(false, device.index())),
        down(c10::cuda::getStreamFromPool(false, device.index())) {}
  static at::TensorOptions Pinned() { return at::TensorOptions().dtype(at::kByte).pinned_memory(true); }
  // One copy in each direction asked for, waited for.
  void Copy(bool h2d, bool d2h) {
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
  }
  at::Tensor host_in, host_out, dev_in, dev_out;
  c10::cuda::CUDAGuard guard;
  c10::cuda::CUDAStream up, down;
};
#endif

// Each direction alone and both at once, best of 3 after a warm-up copy.
void MeasurePcie(c10::Device device, NodeProfile* p) {
#if OFFLOADD_WITH_CUDA
  CopyPair pair(device);
  auto best_of = [&](bool h2d, bool d2h) {
    double best = 1e30;
    for (int rep = 0; rep < 4; ++rep) {
      c10::cuda::device_synchronize();
      const auto t0 = Clock::now();
      pair.Copy(h2d, d2h);
      if (rep > 0) best = std::min(best, Since(t0));  // rep 0 warms up
    }
    return static_cast<double>(CopyPair::kBytes) * ((h2d ? 1 : 0) + (d2h ? 1 : 0)) / best;
  };
  p->h2d_bytes_per_s = best_of(true, false);
  p->d2h_bytes_per_s = best_of(false, true);
  p->both_bytes_per_s = best_of(true, true);
#else
  (void)device;
  (void)p;
#endif
}

// The AdamW rate on `threads` threads while both PCIe directions copy in a loop (what the step's
// weight uploads and gradient downloads do to the memory bus).
double MeasureAdamWDuringDma(c10::Device device, int threads, workers::KernelPath path) {
#if OFFLOADD_WITH_CUDA
  std::atomic<bool> stop{false}, copying{false};
  std::thread dma([&] {
    CopyPair pair(device);  // built on this thread: its device guard and streams are this thread's
    while (!stop.load()) {
      pair.Copy(true, true);
      copying = true;
    }
  });
  while (!copying.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const double rate = MeasureAdamW(threads, path);
  stop = true;
  dma.join();
  return rate;
#else
  (void)device;
  (void)threads;
  (void)path;
  return 0;
#endif
}

// Sequential write then read of 256 MiB in 4 MiB requests in `dir` (O_DIRECT when the file
// system allows it, else buffered with the written pages dropped before reading), the file
// removed after.
Status MeasureStore(const std::string& dir, NodeProfile::StoreRate* p) {
  constexpr size_t kChunk = size_t{4} << 20, kTotal = size_t{256} << 20;
  const std::string path = JoinPath(dir, ".offloadd-node-profile.tmp");
  int flags = O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC;
  int fd = open(path.c_str(), flags | O_DIRECT, 0600);
  p->direct_io = fd >= 0;
  if (fd < 0) fd = open(path.c_str(), flags, 0600);
  if (fd < 0) return UnavailableError("cannot create " + path + ": " + std::strerror(errno));
  void* raw = nullptr;
  if (posix_memalign(&raw, 4096, kChunk) != 0) {
    close(fd);
    unlink(path.c_str());
    return ResourceExhaustedError("no memory for the store measurement");
  }
  std::unique_ptr<void, decltype(&std::free)> buf(raw, &std::free);
  std::memset(raw, 0x5a, kChunk);
  Status st = OkStatus();
  auto pass = [&](bool write) {
    const auto t0 = Clock::now();
    for (size_t off = 0; off < kTotal && st.ok(); off += kChunk) {
      const ssize_t n = write ? pwrite(fd, raw, kChunk, static_cast<off_t>(off))
                              : pread(fd, raw, kChunk, static_cast<off_t>(off));
      if (n != static_cast<ssize_t>(kChunk)) {
        st = DataLossError(std::string(write ? "write" : "read") + " of " + path + " failed: " +
                           (n < 0 ? std::strerror(errno) : "short transfer"));
      }
    }
    if (write && st.ok() && fdatasync(fd) != 0) st = DataLossError("fdatasync " + path + ": " + std::strerror(errno));
    return static_cast<double>(kTotal) / Since(t0);
  };
  struct stat sb {};
  if (fstat(fd, &sb) == 0) p->device = static_cast<uint64_t>(sb.st_dev);
  p->write_bytes_per_s = pass(true);
  if (!p->direct_io) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (st.ok()) p->read_bytes_per_s = pass(false);
  close(fd);
  unlink(path.c_str());
  if (!st.ok()) p->read_bytes_per_s = p->write_bytes_per_s = 0;
  return st;
}

}  // namespace

StatusOr<NodeProfile> LoadOrMeasureNodeProfile(const std::string& dir, int threads,
                                               const std::string& kernel, c10::Device device,
                                               const std::vector<std::string>& store_dirs,
                                               bool* cached, std::string* cache_problem) {
  if (threads < 1) return InvalidArgumentError("node profile: threads must be >= 1");
  // The daemon's profile cache (profile_dir), not a job's file: with the process's own rights
  // (common/file_identity.h).
  ScopedJobFileIdentity daemon_own(std::nullopt);
  ASSIGN_OR_RETURN(workers::KernelChoice choice, workers::ResolveKernelPath(kernel));
  const std::string path_name(workers::KernelPathName(choice.path));
  std::ostringstream key;
  key << HostName() << " | " << CpuModel() << " | " << UsableCores() << " cores | AdamW " << threads
      << " threads " << path_name << " | "
      << (store_dirs.empty() ? std::string("no store") : "store");
  for (const auto& d : store_dirs) key << " " << d;
  key << " | ";
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
  for (int t = 1;; t = std::min(threads, 2 * t)) {
    p.adamw_by_threads.push_back(
        {t, t == threads ? p.cpu_params_per_s : MeasureAdamW(t, choice.path)});
    if (t == threads) break;
  }
  // The AdamW kernel runs at the memory roofline, so its own traffic (28 B per parameter) is a
  // bandwidth the host sustains too; a plain triad understates it on the H200 hosts (86 against
  // the 123-128 GB/s that AdamW-shaped traffic reached there). The larger of the two counts.
  p.host_bytes_per_s = std::max(p.host_bytes_per_s, 28.0 * p.cpu_params_per_s);
  if (device.is_cuda()) {
    MeasurePcie(device, &p);
    p.cpu_params_per_s_during_dma = MeasureAdamWDuringDma(device, threads, choice.path);
  }
  for (const auto& store : store_dirs) {
    NodeProfile::StoreRate r;
    r.dir = store;
    // A store that cannot be measured is named; the job itself finds out what it can do.
    if (Status st = MeasureStore(store, &r); !st.ok())
      *cache_problem = "store not measured: " + std::string(st.message());
    p.stores.push_back(r);
  }
  SumStoreRates(&p);
  p.measure_seconds = Since(t0);
  p.measured_at = NowUtcIso8601();
  if (!file.empty()) {
    // The cache only saves time: a job does not fail because it cannot be written.
    Status st = MakeDirs(dir);
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
  std::string out = buf;
  if (!p.adamw_by_threads.empty()) {
    out += "; AdamW by threads";
    for (const auto& r : p.adamw_by_threads) {
      std::snprintf(buf, sizeof(buf), " %d: %.2f", r.threads, r.params_per_s / 1e9);
      out += buf;
    }
    out += " G params/s";
  }
  if (p.cpu_params_per_s_during_dma > 0) {
    std::snprintf(buf, sizeof(buf), ", %.2f while both PCIe directions copy", p.cpu_params_per_s_during_dma / 1e9);
    out += buf;
  }
  for (const auto& s : p.stores) {
    std::snprintf(buf, sizeof(buf), "; store %s write %.2f / read %.2f GB/s%s", s.dir.c_str(),
                  s.write_bytes_per_s / 1e9, s.read_bytes_per_s / 1e9,
                  s.direct_io ? " (O_DIRECT)" : " (buffered: no O_DIRECT there)");
    out += buf;
  }
  if (p.stores.size() > 1) {
    std::snprintf(buf, sizeof(buf), "; striped write %.2f / read %.2f GB/s",
                  p.store_write_bytes_per_s / 1e9, p.store_read_bytes_per_s / 1e9);
    out += buf;
  }
  return out;
}

}  // namespace offloadd::trainer
