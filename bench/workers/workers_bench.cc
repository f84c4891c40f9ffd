// offloadd-workers-bench: memory bandwidth (STREAM-style copy and triad), the fused AdamW kernel
// per code path and thread count, and a WorkerPool step across processes, measured in one run on
// the same number of parameters. Prints one JSON object per measurement (run_bench.py makes the
// table).
//
//   offloadd-workers-bench --params=33554432 --threads=1,2 --pool=1x2,2x1 --repeats=5
//
// Bytes per AdamW parameter: bf16 grad read 2 + fp32 master/exp_avg/exp_avg_sq read 12 and
// written 12 + bf16 weight written 2 = 28 B (write-allocate traffic not counted, as in STREAM).
// The compact optimizer modes (workers/adamw_compact.h) report their own bytes per parameter
// (StepTrafficBytesPerParam: 16.06 with int8 states) and their share of the triad's roofline;
// --compact runs only the triad, the exact kernel and those (offloadd-workers-bench --compact
// --threads=1,2); --paths=avx512bf16,avx2 limits the kernel flavours.
// Each figure is the best of --repeats runs after a warm-up (the median is printed too): on a
// shared machine other load only ever slows a run down.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "workers/adamw_compact.h"
#include "workers/adamw_kernel.h"
#include "workers/adamw_kernel_impl.h"
#include "workers/cpu_topology.h"
#include "workers/shard_executor.h"
#include "workers/shard_layout.h"
#include "workers/step_driver.h"
#include "workers/worker_pool.h"

namespace offloadd::workers {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kAdamWBytesPerParam = 28;

struct Args {
  uint64_t params = 32ull << 20;
  std::vector<int> threads;
  std::vector<std::pair<uint32_t, uint32_t>> pools;
  int repeats = 5;
  bool undo_variants = true;
  bool compact_only = false;
  std::vector<KernelPath> paths = SupportedPaths();  // --paths
  std::map<int, double> triad_gbps;  // by thread count, from Stream
};

std::vector<int> Cpus() {
  auto nodes = NumaNodes(AllowedCpus());
  std::vector<int> all;
  for (auto& n : nodes) all.insert(all.end(), n.begin(), n.end());
  return all;
}

// Runs fn(thread_index) on `threads` pinned threads and returns the wall time.
template <typename Fn>
double Parallel(int threads, Fn fn) {
  static const std::vector<int> cpus = Cpus();
  std::vector<std::thread> ts;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[t % cpus.size()], &set);
      pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
      fn(t);
    });
  }
  for (auto& t : ts) t.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::pair<uint64_t, uint64_t> Slice(uint64_t n, int threads, int t) {
  const uint64_t per = (n / threads + 15) / 16 * 16;
  const uint64_t b = std::min(n, per * t), e = t + 1 == threads ? n : std::min(n, per * (t + 1));
  return {b, e};
}

template <typename T>
T* Alloc(uint64_t n) {
  return static_cast<T*>(std::aligned_alloc(4096, (n * sizeof(T) + 4095) / 4096 * 4096));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

// STREAM kernels, vectorised for the best ISA the CPU has (the compiler clones them).
__attribute__((target_clones("avx512f", "avx2", "default"))) void TriadLoop(
    float* __restrict x, const float* __restrict y, const float* __restrict z, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) x[i] = y[i] + 3.0f * z[i];
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void CopyLoop(
    float* __restrict x, const float* __restrict y, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) x[i] = y[i];
}
// The memory traffic of the AdamW update (bf16 grad in, three fp32 arrays read and written, bf16
// out) with almost no arithmetic: the bandwidth roof for this access pattern on this machine.
__attribute__((target_clones("avx512f", "avx2", "default"))) void AdamWShapeLoop(
    const uint16_t* __restrict g, float* __restrict p, float* __restrict m, float* __restrict v,
    uint16_t* __restrict w, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t bits = uint32_t{g[i]} << 16;
    float gi;
    std::memcpy(&gi, &bits, 4);
    const float np = p[i] + gi;
    p[i] = np;
    m[i] = m[i] + gi;
    v[i] = v[i] + gi;
    uint32_t pb;
    std::memcpy(&pb, &np, 4);
    w[i] = static_cast<uint16_t>(pb >> 16);
  }
}

void Emit(nlohmann::json j) { std::cout << j.dump() << std::endl; }

// Returns the triad's bandwidth (GB/s, best run).
double Stream(const Args& a, int threads) {
  const uint64_t n = a.params;
  float* x = Alloc<float>(n);
  float* y = Alloc<float>(n);
  float* z = Alloc<float>(n);
  Parallel(threads, [&](int t) {  // first touch by the threads that use the pages
    auto [b, e] = Slice(n, threads, t);
    for (uint64_t i = b; i < e; ++i) x[i] = 1, y[i] = 2, z[i] = 3;
  });
  std::vector<double> copy, triad;
  for (int r = 0; r < a.repeats + 1; ++r) {
    const double tc = Parallel(threads, [&](int t) {
      auto [b, e] = Slice(n, threads, t);
      CopyLoop(x + b, y + b, e - b);
    });
    const double tt = Parallel(threads, [&](int t) {
      auto [b, e] = Slice(n, threads, t);
      TriadLoop(x + b, y + b, z + b, e - b);
    });
    if (r > 0) copy.push_back(tc), triad.push_back(tt);  // first round is warm-up
  }
  Emit({{"bench", "stream_copy"},
        {"threads", threads},
        {"gbps", 8.0 * n / Best(copy) / 1e9},
        {"gbps_median", 8.0 * n / Median(copy) / 1e9}});
  Emit({{"bench", "stream_triad"},
        {"threads", threads},
        {"gbps", 12.0 * n / Best(triad) / 1e9},
        {"gbps_median", 12.0 * n / Median(triad) / 1e9}});
  std::free(x);
  std::free(y);
  std::free(z);
  return 12.0 * n / Best(triad) / 1e9;
}

void Kernel(const Args& a, KernelPath path, int threads) {
  const uint64_t n = a.params;
  uint16_t* g = Alloc<uint16_t>(n);
  uint16_t* w = Alloc<uint16_t>(n);
  float* p = Alloc<float>(n);
  float* m = Alloc<float>(n);
  float* v = Alloc<float>(n);
  Parallel(threads, [&](int t) {
    auto [b, e] = Slice(n, threads, t);
    for (uint64_t i = b; i < e; ++i) {
      g[i] = internal::FloatToBf16(1e-3f * static_cast<float>((i * 2654435761u) % 1000) - 0.5f);
      p[i] = 0.01f * static_cast<float>(i % 100);
      m[i] = v[i] = 0;
      w[i] = 0;
    }
  });
  if (path == BestPath()) {  // once per thread count: the same traffic without the arithmetic
    std::vector<double> shape;
    for (int r = 0; r < a.repeats + 1; ++r) {
      const double secs = Parallel(threads, [&](int t) {
        auto [b, e] = Slice(n, threads, t);
        AdamWShapeLoop(g + b, p + b, m + b, v + b, w + b, e - b);
      });
      if (r > 0) shape.push_back(secs);
    }
    Emit({{"bench", "stream_adamw_shape"},
          {"threads", threads},
          {"gbps", kAdamWBytesPerParam * n / Best(shape) / 1e9},
          {"gbps_median", kAdamWBytesPerParam * n / Median(shape) / 1e9}});
    Parallel(threads, [&](int t) {  // restore sane optimizer state
      auto [b, e] = Slice(n, threads, t);
      for (uint64_t i = b; i < e; ++i) p[i] = 0.01f * static_cast<float>(i % 100), m[i] = v[i] = 0;
    });
  }
  std::vector<double> times;
  for (int r = 0; r < a.repeats + 1; ++r) {
    AdamWHyper h;
    h.step = static_cast<uint64_t>(r + 1);
    const double secs = Parallel(threads, [&](int t) {
      auto [b, e] = Slice(n, threads, t);
      AdamWSpan s{g + b, GradDtype::kBf16, p + b, m + b, v + b, w + b, WeightDtype::kBf16, e - b};
      FusedAdamW(s, h, path);
    });
    if (r > 0) times.push_back(secs);
  }
  const double t = Best(times);
  Emit({{"bench", "adamw_kernel"},
        {"path", std::string(KernelPathName(path))},
        {"threads", threads},
        {"params_per_s", n / t},
        {"gbps", kAdamWBytesPerParam * n / t / 1e9},
        {"gbps_median", kAdamWBytesPerParam * n / Median(times) / 1e9}});
  for (void* x : {static_cast<void*>(g), static_cast<void*>(w), static_cast<void*>(p),
                  static_cast<void*>(m), static_cast<void*>(v)}) {
    std::free(x);
  }
}

// One compact mode on one path: G params/s, bytes per parameter per step, and the share of the
// triad's roofline (the triad's bandwidth over the mode's bytes per parameter) it reaches.
void Compact(const Args& a, KernelPath path, int threads, OptimizerMode mode) {
  const uint64_t n = a.params / kInt8BlockSize * kInt8BlockSize;
  const uint64_t blocks = Int8Blocks(n);
  uint16_t* g = Alloc<uint16_t>(n);
  uint16_t* w = Alloc<uint16_t>(n);
  float* p = Alloc<float>(n);  // fp32 master, or bf16 master + bf16 compensation (same 4 bytes)
  const size_t sb = mode.state == StateDtype::kFp32 ? 4 : mode.state == StateDtype::kBf16 ? 2 : 1;
  uint8_t* m = Alloc<uint8_t>(n * sb);
  uint8_t* v = Alloc<uint8_t>(n * sb);
  float* ms = Alloc<float>(blocks);
  float* vs = Alloc<float>(blocks);
  const bool bf16_master = mode.master == MasterDtype::kBf16;
  uint16_t* hi = reinterpret_cast<uint16_t*>(p);
  uint16_t* lo = hi + n;
  Parallel(threads, [&](int t) {
    auto [b, e] = Slice(blocks, threads, t);
    for (uint64_t i = b * kInt8BlockSize; i < std::min(n, e * kInt8BlockSize); ++i) {
      g[i] = internal::FloatToBf16(1e-3f * static_cast<float>((i * 2654435761u) % 1000) - 0.5f);
      const float x = 0.01f * static_cast<float>(i % 100);
      if (bf16_master) {
        hi[i] = internal::FloatToBf16(x), lo[i] = 0;
      } else {
        p[i] = x;
      }
      w[i] = 0;
    }
    std::memset(m + b * kInt8BlockSize * sb, 0,
                (std::min(n, e * kInt8BlockSize) - b * kInt8BlockSize) * sb);
    std::memset(v + b * kInt8BlockSize * sb, 0,
                (std::min(n, e * kInt8BlockSize) - b * kInt8BlockSize) * sb);
    for (uint64_t k = b; k < e; ++k) ms[k] = vs[k] = 0;
  });
  std::vector<double> times;
  bool ok = true;
  for (int r = 0; r < a.repeats + 1; ++r) {
    AdamWHyper h;
    h.step = static_cast<uint64_t>(r + 1);
    const double secs = Parallel(threads, [&](int t) {
      auto [b, e] = Slice(blocks, threads, t);
      const uint64_t i0 = b * kInt8BlockSize, i1 = std::min(n, e * kInt8BlockSize);
      CompactSpan s;
      s.grad = g + i0;
      s.master = bf16_master ? static_cast<void*>(hi + i0) : p + i0;
      s.master_comp = lo + i0;
      s.exp_avg = m + i0 * sb;
      s.exp_avg_sq = v + i0 * sb;
      s.exp_avg_scale = ms + b;
      s.exp_avg_sq_scale = vs + b;
      s.weights = w + i0;
      s.n = i1 - i0;
      s.first_index = i0;
      if (!CompactAdamW(s, mode, h, path).ok()) ok = false;
    });
    if (r > 0) times.push_back(secs);
  }
  const double t = Best(times);
  const double bytes = StepTrafficBytesPerParam(mode, GradDtype::kBf16, WeightDtype::kBf16);
  const double triad = a.triad_gbps.count(threads) ? a.triad_gbps.at(threads) : 0;
  Emit({{"bench", "adamw_compact"},
        {"mode", mode.Describe()},
        {"state_dtype", std::string(StateDtypeName(mode.state))},
        {"master_dtype", std::string(MasterDtypeName(mode.master))},
        {"path", std::string(KernelPathName(path))},
        {"threads", threads},
        {"ok", ok},
        {"bytes_per_param", bytes},
        {"gparams_per_s", n / t / 1e9},
        {"gbps", bytes * n / t / 1e9},
        {"gbps_median", bytes * n / Median(times) / 1e9},
        {"triad_gbps", triad},
        {"of_triad_roofline", triad > 0 ? bytes * n / t / 1e9 / triad : 0.0}});
  for (void* x :
       {static_cast<void*>(g), static_cast<void*>(w), static_cast<void*>(p), static_cast<void*>(m),
        static_cast<void*>(v), static_cast<void*>(ms), static_cast<void*>(vs)}) {
    std::free(x);
  }
}

// The worker's ShardExecutor in this process (no IPC): with and without redo slots, alternating
// run by run so that drift in the machine's load hits both alike.
Status Executor(const Args& a, uint32_t threads) {
  const uint64_t n = a.params;
  const std::vector<uint64_t> layers = {n};
  WorkerPoolOptions po;
  po.threads_per_process = threads;
  ASSIGN_OR_RETURN(ipc::SharedSegment seg,
                   ipc::SharedSegment::Create(ArenaBytesFor(layers, {}, po)));
  ASSIGN_OR_RETURN(ipc::Arena arena, ipc::Arena::Format(&seg, {.max_regions = 64}));
  ASSIGN_OR_RETURN(std::vector<ShardSpec> specs, AllocateShards(&arena, layers, {}, 1));
  ASSIGN_OR_RETURN(ipc::Region undo,
                   arena.Allocate("redo", ipc::RegionKind::kControl, UndoRegionBytes(threads)));
  const ShardSpec& sp = specs[0];
  uint16_t* g = arena.At<uint16_t>(sp.grad_offset);
  for (uint64_t i = 0; i < n; ++i) g[i] = internal::FloatToBf16(1e-3f * (i % 1000) - 0.5f);
  static const std::vector<int> cpus = Cpus();
  std::unique_ptr<ShardExecutor> ex[2];
  for (int cc = 0; cc < 2; ++cc) {
    ExecutorOptions eo;
    eo.threads = threads;
    eo.path = BestPath();
    eo.crash_consistent = cc == 1;
    eo.undo_offset = undo.offset;
    eo.cpus = cpus;
    ex[cc] = std::make_unique<ShardExecutor>(&arena, eo);
    RETURN_IF_ERROR(ex[cc]->Start());
  }
  std::vector<double> times[2];
  uint64_t step = 0;
  for (int r = 0; r < a.repeats + 1; ++r) {
    for (int cc = 0; cc < 2; ++cc) {
      ipc::CommandRecord cmd{};
      cmd.kind = static_cast<uint32_t>(CommandKind::kAdamW);
      cmd.Pack(AdamWCommand{n, sp.grad_offset, sp.master_offset, sp.exp_avg_offset,
                            sp.exp_avg_sq_offset, sp.weights_offset, sp.counters_offset, ++step,
                            1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0f, 0});
      const auto start = Clock::now();
      const WorkerCompletion done = ex[cc]->Execute(cmd);
      const double secs = std::chrono::duration<double>(Clock::now() - start).count();
      if (done.status_code != 0 || done.elements != n) {
        return InternalError(std::string("executor bench: ") + done.message);
      }
      if (r > 0) times[cc].push_back(secs);
    }
  }
  for (int cc = 0; cc < 2; ++cc) {
    Emit({{"bench", "adamw_executor"},
          {"threads", threads},
          {"crash_consistent", cc == 1},
          {"path", std::string(KernelPathName(BestPath()))},
          {"params_per_s", n / Best(times[cc])},
          {"gbps", kAdamWBytesPerParam * n / Best(times[cc]) / 1e9},
          {"gbps_median", kAdamWBytesPerParam * n / Median(times[cc]) / 1e9}});
  }
  return OkStatus();
}

Status Pool(const Args& a, uint32_t processes, uint32_t threads, bool crash_consistent) {
  const uint64_t n = a.params;
  WorkerPoolOptions o;
  o.processes = processes;
  o.threads_per_process = threads;
  o.crash_consistent = crash_consistent;
  // 8 shards per process, like 8 layers per worker in flight.
  const ShardLayoutOptions layout{.max_shard_elements = (n + processes * 8 - 1) / (processes * 8)};
  const std::vector<uint64_t> layers = {n};
  ASSIGN_OR_RETURN(ipc::SharedSegment seg,
                   ipc::SharedSegment::Create(ArenaBytesFor(layers, layout, o)));
  ASSIGN_OR_RETURN(
      ipc::Arena arena,
      ipc::Arena::Format(&seg, {.max_regions = RegionsFor(layers, layout, processes)}));
  ASSIGN_OR_RETURN(std::vector<ShardSpec> specs, AllocateShards(&arena, layers, layout, processes));
  for (const ShardSpec& sp : specs) {
    uint16_t* g = arena.At<uint16_t>(sp.grad_offset);
    for (uint64_t i = 0; i < sp.num_elements; ++i) {
      g[i] = internal::FloatToBf16(1e-3f * static_cast<float>(i % 1000) - 0.5f);
    }
  }
  o.worker_binary = (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
                     "../../workers/offloadd-worker")
                        .string();
  if (const char* dir = std::getenv("OFFLOADD_BINARY_DIR"))
    o.worker_binary = std::string(dir) + "/workers/offloadd-worker";
  ASSIGN_OR_RETURN(std::unique_ptr<WorkerPool> pool, WorkerPool::Start(&seg, &arena, o));
  StepDriver driver(pool.get(), specs, OptimizerConfig{.weight_decay = 0.01});
  std::vector<double> times;
  for (int r = 0; r < a.repeats + 1; ++r) {
    const auto start = Clock::now();
    RETURN_IF_ERROR(driver.BeginStep(r + 1, 1e-3));
    for (size_t s = specs.size(); s-- > 0;) RETURN_IF_ERROR(driver.GradsReady(s, 0));
    ASSIGN_OR_RETURN(StepResult res, driver.FinishStep());
    if (res.params_updated != n) {  // every chunk must really have been updated
      return InternalError("pool updated " + std::to_string(res.params_updated) + " of " +
                           std::to_string(n) + " parameters");
    }
    if (r > 0) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  const double t = Best(times);
  Emit({{"bench", "adamw_pool"},
        {"processes", processes},
        {"threads", threads},
        {"crash_consistent", crash_consistent},
        {"path", pool->Metrics().kernel_path},
        {"params_per_s", n / t},
        {"gbps", kAdamWBytesPerParam * n / t / 1e9},
        {"gbps_median", kAdamWBytesPerParam * n / Median(times) / 1e9}});
  return pool->Shutdown();
}

}  // namespace
}  // namespace offloadd::workers

int main(int argc, char** argv) {
  using namespace offloadd::workers;
  Args a;
  const int ncpu = static_cast<int>(AllowedCpus().size());
  for (int t = 1; t <= ncpu; t *= 2) a.threads.push_back(t);
  if (a.threads.back() != ncpu) a.threads.push_back(ncpu);
  a.pools = {{1, static_cast<uint32_t>(ncpu)}};
  if (ncpu > 1) a.pools.push_back({2, static_cast<uint32_t>(ncpu / 2)});
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto val = [&](const char* key) -> const char* {
      const size_t k = std::strlen(key);
      return arg.compare(0, k, key) == 0 ? arg.c_str() + k : nullptr;
    };
    if (const char* v = val("--params=")) {
      a.params = std::strtoull(v, nullptr, 10);
    } else if (const char* v2 = val("--repeats=")) {
      a.repeats = std::max(1, std::atoi(v2));
    } else if (const char* v3 = val("--threads=")) {
      auto list = ParseCpuList(v3);
      if (!list.ok() || list->empty()) {
        std::cerr << "bad --threads\n";
        return 2;
      }
      a.threads = *list;
    } else if (const char* v4 = val("--pool=")) {  // e.g. 1x16,2x8
      a.pools.clear();
      std::string s = v4;
      size_t pos = 0;
      while (pos < s.size()) {
        const size_t comma = std::min(s.find(',', pos), s.size());
        const std::string item = s.substr(pos, comma - pos);
        const size_t x = item.find('x');
        if (x == std::string::npos) {
          std::cerr << "bad --pool item '" << item << "' (want PxT)\n";
          return 2;
        }
        a.pools.push_back({static_cast<uint32_t>(std::stoul(item.substr(0, x))),
                           static_cast<uint32_t>(std::stoul(item.substr(x + 1)))});
        pos = comma + 1;
      }
    } else if (arg == "--compact") {
      a.compact_only = true;
    } else if (const char* v5 = val("--paths=")) {  // e.g. avx512bf16,avx2
      a.paths.clear();
      std::string s = v5;
      for (size_t pos = 0; pos < s.size();) {
        const size_t comma = std::min(s.find(',', pos), s.size());
        auto path = ParseKernelPath(s.substr(pos, comma - pos));
        if (!path.ok()) {
          std::cerr << "--paths: " << path.status().ToString() << "\n";
          return 2;
        }
        a.paths.push_back(*path);
        pos = comma + 1;
      }
    } else {
      std::cerr << "usage: offloadd-workers-bench [--params=N] [--threads=1,2,4] [--pool=1x4,2x2] "
                   "[--repeats=R] [--compact] [--paths=avx512bf16,avx2]\n";
      return 2;
    }
  }
  if (a.params < kChunkElements) {
    std::cerr << "--params must be at least " << kChunkElements << "\n";
    return 2;
  }
  for (int t : a.threads) a.triad_gbps[t] = Stream(a, t);
  for (KernelPath p : a.paths) {
    for (int t : a.threads) {
      for (StateDtype sd : {StateDtype::kFp32, StateDtype::kBf16, StateDtype::kInt8}) {
        for (MasterDtype md : {MasterDtype::kFp32, MasterDtype::kBf16}) Compact(a, p, t, {sd, md});
      }
    }
  }
  for (KernelPath p : a.paths) {
    for (int t : a.threads) Kernel(a, p, t);
  }
  if (a.compact_only) return 0;
  for (int t : a.threads) {
    offloadd::Status st = Executor(a, static_cast<uint32_t>(t));
    if (!st.ok()) {
      std::cerr << "executor: " << st.ToString() << "\n";
      return 1;
    }
  }
  for (auto [procs, threads] : a.pools) {
    for (bool cc : {true, false}) {
      offloadd::Status st = Pool(a, procs, threads, cc);
      if (!st.ok()) {
        std::cerr << "pool " << procs << "x" << threads << ": " << st.ToString() << "\n";
        return 1;
      }
    }
  }
  return 0;
}
