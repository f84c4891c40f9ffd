// The per-block shape profile in the trainer: recorded from the compute spans
// and allocator figures of the step the plan is priced with (the first on a CPU device, the second
// on CUDA), cached under <profile_dir>/shapes, and read back by the next run of the same GPU,
// model and micro-batch shape, whose PlanDevice then sizes the step's working set from it.
#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#if OFFLOADD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

#include "common/units.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {

namespace {
std::string DeviceName(bool cuda, c10::Device device) {
#if OFFLOADD_WITH_CUDA
  if (cuda) return at::cuda::getDeviceProperties(device.has_index() ? device.index() : 0)->name;
#else
  (void)cuda;
  (void)device;
#endif
  return "cpu";
}
}  // namespace

int64_t Trainer::Impl::SeqLength() const {
  return cfg.data.synthetic_seq_length > 0 ? cfg.data.synthetic_seq_length : cfg.data.max_seq_length;
}

bool Trainer::Impl::FixedShape() const { return cfg.data.synthetic_seq_length > 0 || cfg.data.packing; }

std::string Trainer::Impl::ShapeKey(int64_t batch) const {
  return ShapeProfileKey(DeviceName(cuda, device), Fingerprint(), batch, SeqLength(),
                         c10::toString(dtype));
}

std::optional<ShapeProfile> Trainer::Impl::CachedShapeProfile(int64_t batch) {
  if (cfg.profile_dir.empty() || !FixedShape()) return std::nullopt;
  const std::string key = ShapeKey(batch);
  const std::string path = ShapeProfilePath(cfg.profile_dir, key);
  auto p = ReadShapeProfile(path);
  if (!p.ok()) {
    // Absent: the first run of this shape measures it. Unreadable: measured again and replaced.
    if (p.status().code() != StatusCode::kNotFound) {
      Log(TrainObserver::Level::kWarning, "shape profile " + std::string(p.status().message()) +
                                              "; this run measures it again");
    }
    return std::nullopt;
  }
  if (p->key != key || static_cast<int>(p->blocks.size()) != n) {
    Log(TrainObserver::Level::kWarning, "shape profile " + path + " is for another shape (" + p->key +
                                            "); this run measures it again");
    return std::nullopt;
  }
  return *p;
}

Status Trainer::Impl::RecordShapeProfile() {
  RETURN_IF_ERROR(pipeline.accounting->Flush());  // the step's compute spans
  const StepStats& s = pipeline.accounting->last_stats();
  const double A = static_cast<double>(cfg.gradient_accumulation_steps);
  ShapeProfile p;
  p.gpu = DeviceName(cuda, device);
  p.model = Fingerprint();
  p.batch = cfg.batch_size;
  p.seq = SeqLength();
  p.dtype = c10::toString(dtype);
  p.key = ShapeProfileKey(p.gpu, p.model, p.batch, p.seq, p.dtype);
  const std::string& key = p.key;
  p.profiled_step = s.step;
  std::map<std::string, int> index;
  for (int b = 0; b < n; ++b) {
    engine::Block& block = model->block(b);
    BlockProfile bp;
    bp.name = block.name();
    bp.mode = device_plan.offload_checkpoint[b]
                  ? "recompute_offload_cpu"
                  : std::string(engine::SaveModeName(device_plan.modes[b]));
    const engine::BlockCost c = block.EstimateCost(cfg.batch_size, p.seq, dtype);
    bp.keep_bytes = block.last_saved_bytes();  // measured (kept, offloaded or recomputed)
    bp.recompute_bytes = c.saved_bytes_recompute;  // its input: exactly [batch, seq, hidden]
    index[bp.name] = b;
    p.blocks.push_back(std::move(bp));
  }
  for (const Span& sp : pipeline.accounting->last_compute_spans()) {
    const bool fwd = sp.name.rfind("forward ", 0) == 0, bwd = sp.name.rfind("backward ", 0) == 0;
    if (!fwd && !bwd) continue;
    auto it = index.find(sp.name.substr(fwd ? 8 : 9));
    if (it == index.end()) continue;
    BlockProfile& bp = p.blocks[it->second];
    const double secs = (sp.end_us - sp.start_us) * 1e-6 / A;
    const int64_t transient = std::max<int64_t>(0, sp.mem_peak - sp.mem_start);
    (fwd ? bp.forward_s : bp.backward_s) += secs;
    int64_t& t = fwd ? bp.forward_transient_bytes : bp.backward_transient_bytes;
    t = std::max(t, transient);
  }
  for (int b = 0; b < n; ++b) {
    // The recompute runs the forward's own computation (Block::Run) once more.
    if (device_plan.modes[b] == engine::SaveMode::kRecompute)
      p.blocks[b].recompute_s = p.blocks[b].forward_s;
  }
  p.gpu_seconds = s.gpu_compute_seconds / A;
  p.peak_reserved_bytes = pipeline.streams->PeakReservedBytes();
  p.peak_allocated_bytes = pipeline.streams->PeakAllocatedBytes();
  p.workspace_bytes = std::max<int64_t>(0, p.peak_reserved_bytes - planner.planned_held_bytes);
  p.measured_at = NowUtcIso8601();
  double slowest = -1;
  int slow = 0;
  for (int b = 0; b < n; ++b) {
    if (p.blocks[b].backward_s > slowest) slowest = p.blocks[b].backward_s, slow = b;
  }
  Log(TrainObserver::Level::kInfo,
      "shape profile (step " + std::to_string(s.step) + ", " + key + "): GPU " +
          FormatByteSize(static_cast<uint64_t>(p.peak_reserved_bytes)) +
          " peak reserved, working set " +
          FormatByteSize(static_cast<uint64_t>(p.workspace_bytes)) + " beyond the planned " +
          FormatByteSize(static_cast<uint64_t>(planner.planned_held_bytes)) +
          "; slowest backward " + DescribeBlockProfile(p.blocks[slow]));
  if (!cfg.profile_dir.empty()) {
    // The cache only saves the next run a static estimate: a job does not fail on it.
    if (Status st = WriteShapeProfile(cfg.profile_dir, p); !st.ok()) {
      Log(TrainObserver::Level::kWarning, "shape profile not cached: " + std::string(st.message()));
    }
  }
  planner.shape_profile = std::move(p);
  return OkStatus();
}

}  // namespace offloadd::trainer
