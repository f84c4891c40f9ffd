#include "workers/shard_layout.h"

#include <string>

#include "ipc/numa.h"
#include "workers/shard_executor.h"

namespace offloadd::workers {
namespace {

constexpr uint64_t kAlign = 4096;  // ipc::ArenaOptions::alignment default
uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t ShardElements(const ShardLayoutOptions& o) {
  return o.max_shard_elements == 0 ? 0 : RoundUp(o.max_shard_elements, kChunkElements);
}

// Calls fn(layer, shard_index_in_layer, elements) for every shard.
template <typename Fn>
void ForEachShard(const std::vector<uint64_t>& layers, const ShardLayoutOptions& o, Fn fn) {
  const uint64_t per = ShardElements(o);
  for (size_t l = 0; l < layers.size(); ++l) {
    const uint64_t n = layers[l];
    if (per == 0 || n <= per) {
      fn(l, 0, n);
      continue;
    }
    for (uint64_t s = 0, begin = 0; begin < n; ++s, begin += per)
      fn(l, s, std::min(per, n - begin));
  }
}

uint32_t RegionsPerShard(const ShardLayoutOptions& o) {
  return 6 + (o.accumulation_steps > 1 ? 2 : 0);
}

// The shard has a 16-bit weight region of its own (not kNone, not staged elsewhere).
bool HasWeights(const ShardLayoutOptions& o, size_t layer) {
  return o.weight_dtype != WeightDtype::kNone &&
         !(layer < o.weights_elsewhere.size() && o.weights_elsewhere[layer]);
}

}  // namespace

uint32_t RegionsFor(const std::vector<uint64_t>& layers, const ShardLayoutOptions& options,
                    uint32_t processes) {
  uint64_t shards = 0;
  ForEachShard(layers, options, [&](size_t, uint64_t, uint64_t) { ++shards; });
  return static_cast<uint32_t>(shards * RegionsPerShard(options) + 3 * uint64_t{processes} + 16);
}

uint64_t ArenaBytesFor(const std::vector<uint64_t>& layers, const ShardLayoutOptions& o,
                       const WorkerPoolOptions& pool) {
  const uint64_t gsize = GradBytes(o.grad_dtype);
  uint64_t bytes = 0;
  ForEachShard(layers, o, [&](size_t l, uint64_t, uint64_t n) {
    const uint64_t states = RoundUp(MasterRegionBytes(o.mode.master, n), kAlign) +
                            2 * RoundUp(StateRegionBytes(o.mode.state, n), kAlign);
    bytes += RoundUp(n * gsize, kAlign) + (o.states_resident ? states : 0) +
             (HasWeights(o, l) ? RoundUp(n * 2, kAlign) : 0) +
             RoundUp(AdamWCountersBytes(n), kAlign);
    if (o.accumulation_steps > 1)
      bytes += RoundUp(n * 4, kAlign) + RoundUp(CountersBytes(n), kAlign);
  });
  const uint64_t rings = ipc::RingQueue<ipc::CommandRecord>::BytesFor(pool.queue_capacity) +
                         ipc::RingQueue<WorkerCompletion>::BytesFor(pool.queue_capacity);
  bytes += pool.processes * (RoundUp(rings, kAlign) + kAlign +
                             RoundUp(UndoRegionBytes(pool.threads_per_process), kAlign));
  const uint64_t table = uint64_t{RegionsFor(layers, o, pool.processes)} * 80 + 4096;
  return bytes + RoundUp(table, kAlign) + kAlign;
}

double BytesPerParameter(const ShardLayoutOptions& o) {
  return static_cast<double>(GradBytes(o.grad_dtype)) +
         (o.states_resident ? StateBytesPerParam(o.mode) : 0) +
         (o.weight_dtype != WeightDtype::kNone ? 2 : 0) + (o.accumulation_steps > 1 ? 4 : 0);
}

Status BindShardsToWorkers(const ipc::Arena& arena, const std::vector<ShardSpec>& shards,
                           const WorkerPool& pool) {
  if (pool.NumaNodesUsed() <= 1) return OkStatus();
  for (const ShardSpec& s : shards) {
    const int node = s.worker >= 0 ? pool.NumaNodeOf(static_cast<uint32_t>(s.worker)) : -1;
    if (node < 0) continue;
    const uint64_t n = s.num_elements;
    const uint64_t gsize = GradBytes(s.grad_dtype);
    const uint64_t state = StateRegionBytes(s.mode.state, n);
    const std::pair<uint64_t, uint64_t> ranges[] = {
        {s.grad_offset, n * gsize}, {s.master_offset, MasterRegionBytes(s.mode.master, n)},
        {s.exp_avg_offset, state},  {s.exp_avg_sq_offset, state},
        {s.weights_offset, n * 2},  {s.accum_offset, n * 4}};
    for (const auto& [offset, bytes] : ranges) {
      if (offset == 0) continue;  // no accumulation buffer
      Status st = ipc::BindToNumaNode(arena.At<void>(offset), bytes, node);
      if (!st.ok()) return st.WithContext("layer " + std::to_string(s.layer));
    }
  }
  return OkStatus();
}

StatusOr<std::vector<ShardSpec>> AllocateShards(ipc::Arena* arena,
                                                const std::vector<uint64_t>& layers,
                                                const ShardLayoutOptions& o, uint32_t processes) {
  if (processes == 0) return InvalidArgumentError("AllocateShards: processes must be > 0");
  const uint64_t gsize = GradBytes(o.grad_dtype);
  std::vector<ShardSpec> out;
  Status status;
  ForEachShard(layers, o, [&](size_t l, uint64_t s, uint64_t n) {
    if (!status.ok()) return;
    if (n == 0) {
      status = InvalidArgumentError("layer " + std::to_string(l) + " has no parameters");
      return;
    }
    const std::string prefix = "L" + std::to_string(l) + ".S" + std::to_string(s) + ".";
    auto alloc = [&](const char* what, ipc::RegionKind kind, uint64_t bytes) -> uint64_t {
      if (!status.ok()) return 0;
      auto r = arena->Allocate(prefix + what, kind, bytes);
      if (!r.ok()) {
        status = r.status();
        return 0;
      }
      return r->offset;
    };
    ShardSpec spec;
    spec.layer = static_cast<uint32_t>(l);
    spec.num_elements = n;
    spec.grad_dtype = o.grad_dtype;
    spec.weight_dtype = o.weight_dtype;
    spec.mode = o.mode;
    spec.grad_offset = alloc("grad", ipc::RegionKind::kGradStaging, n * gsize);
    if (o.states_resident) {
      const uint64_t state = StateRegionBytes(o.mode.state, n);
      spec.master_offset =
          alloc("master", ipc::RegionKind::kMaster, MasterRegionBytes(o.mode.master, n));
      spec.exp_avg_offset = alloc("exp_avg", ipc::RegionKind::kExpAvg, state);
      spec.exp_avg_sq_offset = alloc("exp_avg_sq", ipc::RegionKind::kExpAvgSq, state);
    }
    if (HasWeights(o, l))
      spec.weights_offset = alloc("weights", ipc::RegionKind::kParamStaging, n * 2);
    spec.counters_offset = alloc("counters", ipc::RegionKind::kControl, AdamWCountersBytes(n));
    if (o.accumulation_steps > 1) {
      spec.accum_offset = alloc("accum", ipc::RegionKind::kGradAccum, n * 4);
      spec.accum_counters_offset =
          alloc("accum_counters", ipc::RegionKind::kControl, CountersBytes(n));
    }
    spec.worker = static_cast<int>(out.size() % processes);
    out.push_back(spec);
  });
  if (!status.ok()) return status;
  return out;
}

}  // namespace offloadd::workers
