// The automatic batch size in the trainer (job/batch_planner.h): each
// candidate micro-batch is priced by the step planner on inputs of its own (the static memory
// estimate or the cached shape profile at that micro-batch, its GPU work at the GEMM rate measured
// at that size, the node profile's rates), and the fastest in tokens/s is set before anything is
// sized by the batch. Also the pieces PlanDevice shares with it: the initial activation modes, the
// static memory estimate, the GPU budget and the node profile.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#if OFFLOADD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "common/units.h"
#include "engine/doc_attention.h"
#include "engine/head_chunk_size.h"
#include "engine/parts.h"
#include "job/arena_layout.h"
#include "job/working_set.h"
#include "trainer/pipeline/group_batch.h"
#include "trainer/state/checkpoint.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {

namespace {

engine::SaveMode ToSaveMode(ActivationMode m) {
  switch (m) {
    case ActivationMode::kRecompute:
    case ActivationMode::kRecomputeOffloadCpu:
      return engine::SaveMode::kRecompute;
    case ActivationMode::kOffloadCpu:
    case ActivationMode::kOffloadNvme:
      return engine::SaveMode::kOffload;
    default:
      return engine::SaveMode::kKeep;
  }
}

}  // namespace

void Synchronize(bool cuda) {
#if OFFLOADD_WITH_CUDA
  if (cuda) at::cuda::getCurrentCUDAStream().synchronize();
#else
  (void)cuda;
#endif
}

Status Trainer::Impl::InitialModes() {
  device_plan.modes.assign(n, engine::SaveMode::kKeep);
  device_plan.spill_nvme.assign(n, false);
  device_plan.offload_checkpoint.assign(n, false);
  device_plan.checkpoint_nvme.assign(n, false);
  for (const auto& [layer, m] : cfg.offload.layer_overrides) {
    if (layer < 0 || layer >= n - 2)
      return InvalidArgumentError("activation override for layer " + std::to_string(layer) +
                                  ": the model has " + std::to_string(n - 2) + " layers");
  }
  for (int b = 1; b + 1 < n; ++b) {
    auto it = cfg.offload.layer_overrides.find(b - 1);
    ActivationMode m = it != cfg.offload.layer_overrides.end() ? it->second : cfg.offload.activations;
    // AUTO: keep in host memory; on the GPU recompute every layer (what gradient checkpointing
    // does in the PyTorch baseline): the static estimates of kept activations proved too
    // optimistic against the CUDA kernels' real footprint, and an out-of-memory error mid-job
    // costs more than the recompute.
    if (m == ActivationMode::kAuto) m = cuda ? ActivationMode::kRecompute : ActivationMode::kKeep;
    device_plan.modes[b] = ToSaveMode(m);
    device_plan.spill_nvme[b] = m == ActivationMode::kOffloadNvme;
    device_plan.offload_checkpoint[b] = m == ActivationMode::kRecomputeOffloadCpu;
  }
  return OkStatus();
}

Trainer::Impl::MemoryEstimate Trainer::Impl::EstimateMemory(int64_t B, int64_t seq) const {
  const int64_t T = seq > 0 ? seq : SeqLength();
  const int64_t elem = c10::elementSize(dtype);
  MemoryEstimate est;
  int64_t max_block = 0, max_keep = 0;
  est.cost.resize(n);
  for (int b = 0; b < n; ++b) {
    est.cost[b] = model->block(b).EstimateCost(B, T, dtype);
    const int64_t wb = static_cast<int64_t>(layout[b].numel) * elem;
    est.weights += wb;
    max_block = std::max(max_block, wb);
    max_keep = std::max(max_keep, est.cost[b].saved_bytes_keep);
  }
  // Transients: a block's backward (recompute + gradients of its activations), its parameter
  // gradients, allocator slack, and the larger of the MLP tile's and the head chunk's working sets
  // at the tiles in use (job/tile_plan.h; the constant held the default head chunk's).
  const TileShape shape = TileShapeAt(B, T);
  est.tiles =
      TilesAt(shape, device_plan.tiles.mlp_tile_bytes, device_plan.tiles.head_chunk_bytes).bytes();
  const int64_t slack =
      std::max<int64_t>(0, (int64_t{1280} << 20) - DefaultTiles(shape).head_bytes);
  est.workspace = 2 * max_keep + 3 * max_block + slack + est.tiles;
  // What the block costs leave out (job/working_set.h): packed batches' attention within
  // documents (O(T)), and LSP's own working set on CUDA.
  if (Packed()) {
    const engine::ModelConfig& mc = model->config();
    const bool flash =
        engine::ops::VarlenFlashFits(device, dtype, mc.head_dim, mc.attn_logit_softcap);
    est.packed_attention =
        DocumentAttentionBytes(B, T, mc.num_heads, mc.num_kv_heads, mc.head_dim, elem, flash);
    est.workspace += est.packed_attention;
  }
  if (pipeline.lsp && pipeline.lsp->on_device()) {
    // W_base and the projectors stay resident; a block's effective weights exist while it
    // computes, up to the streaming window's blocks at once.
    est.lsp = pipeline.lsp->WorkingSet().Total(WeightResidency::kWindow + 2);
    est.workspace += est.lsp;
  }
  const bool tied = !model->block(n - 1).shared_params().empty();
  est.streamed = static_cast<int64_t>(WeightResidency::kWindow + 2) * max_block +
                 (tied ? static_cast<int64_t>(layout[0].numel) * elem : 0);
  return est;
}

TileShape Trainer::Impl::TileShapeAt(int64_t B, int64_t T) const {
  const engine::ModelConfig& mc = model->config();
  TileShape s;
  s.tokens = B * T;
  s.ffn = mc.intermediate_size;
  s.vocab = mc.vocab_size;
  s.elem = static_cast<int64_t>(c10::elementSize(dtype));
  s.gated = mc.mlp != engine::MlpKind::kGeluMlp;
  return s;
}

void Trainer::Impl::ApplyTiles(const TileChoice& t) {
  device_plan.tiles = t;
  engine::parts::SetMlpTileBytes(t.mlp_tile_bytes);
  engine::SetHeadChunkBytes(t.head_chunk_bytes);
}

void Trainer::Impl::SetHeldTails(PlanInputs* in, double head_forward_s) const {
  // The backward ends with the embedding's gradient, whose copy out precedes the norm; the
  // next forward ends with the head, updated last (earliest-needed-first), then uploaded (the
  // fp32 masters, when the device casts them).
  const double elem = static_cast<double>(c10::elementSize(dtype));
  const double upload =
      internal::BlockWeightsFp32(HostOptions(), static_cast<size_t>(n - 1)) ? 4.0 : elem;
  in->norm_tail_seconds = elem * static_cast<double>(layout[0].numel) / in->d2h_bytes_per_s;
  in->update_tail_seconds =
      upload * static_cast<double>(layout[n - 1].numel) / in->h2d_bytes_per_s + head_forward_s;
}

void Trainer::Impl::SetParamTraffic(PlanInputs* in, bool streamed, const NodeProfile& prof) const {
  const HostOptimizerOptions o = HostOptions();
  ParamTraffic t;
  t.grad_bytes = static_cast<int>(c10::elementSize(dtype));
  // Per block the device reads fp32 masters (4 B) or a 16-bit copy the update writes: with both
  // (the NVMe tier's blocks in RAM and on NVMe) each is priced at the dearer, an over-estimate.
  bool fp32 = false, copy = false;
  for (int b = 0; b < n; ++b)
    (internal::BlockWeightsFp32(o, static_cast<size_t>(b)) ? fp32 : copy) = true;
  t.upload_bytes = fp32 ? 4 : t.grad_bytes;
  t.weight_copy = copy;
  t.accumulation = static_cast<int>(cfg.gradient_accumulation_steps);
  // The GPU gives each block's norm beside its copy, except with accumulation.
  t.cpu_norm = (cfg.optim.max_grad_norm > 0 || scaler.has_value()) && (t.accumulation > 1 || !cuda);
  t.streamed = streamed;
  t.state_bytes = workers::StateBytesPerParam(optimizer_mode);
  ApplyParamTraffic(t, in);
  in->nvme_params = 0;
  in->nvme_weight_params = 0;
  in->max_device_blocks = -1;
  if (o.tier == StateTier::kNvme) {
    for (int b = 0; b < n; ++b) {
      if (device_plan.nvme_blocks.empty() || device_plan.nvme_blocks[b])
        in->nvme_params += static_cast<double>(layout[b].numel);
      if (b < static_cast<int>(device_plan.nvme_weight_blocks.size()) &&
          device_plan.nvme_weight_blocks[b]) {
        in->nvme_weight_params += static_cast<double>(layout[b].numel);
        if (in->max_device_blocks < 0) in->max_device_blocks = b;
      }
    }
    // Read before each pass that uploads them (WeightResidency): forward and backward of every
    // micro-batch when streamed, once after each update when resident.
    in->nvme_weight_reads = streamed ? 2.0 * cfg.gradient_accumulation_steps : 1.0;
    in->nvme_read_bytes_per_s = prof.store_read_bytes_per_s;
    in->nvme_write_bytes_per_s = prof.store_write_bytes_per_s;
  }
}

int Trainer::Impl::LargestFittingMicroBatch(int cap) const {
  return LargestFittingBatch(cap, [&](int micro) { return FitsStreamed(micro, SeqLength()); });
}

bool Trainer::Impl::FitsStreamed(int micro, int64_t seq) const {
  using Weights = OffloadPlanConfig::Weights;
  const MemoryEstimate est = EstimateMemory(micro, seq);
  int64_t acts = 0;
  for (int b = 0; b < n; ++b) {
    // What PlanDevice can move to pinned RAM: auto layers' checkpoints (recompute_offload_cpu).
    const bool movable = b >= 1 && b + 1 < n && !cfg.offload.layer_overrides.count(b - 1) &&
                         cfg.offload.activations == ActivationMode::kAuto &&
                         device_plan.modes[b] == engine::SaveMode::kRecompute;
    if (device_plan.modes[b] == engine::SaveMode::kKeep) acts += est.cost[b].saved_bytes_keep;
    if (device_plan.modes[b] == engine::SaveMode::kRecompute && !movable &&
        !device_plan.offload_checkpoint[b]) {
      acts += est.cost[b].saved_bytes_recompute;
    }
  }
  const int64_t w = cfg.offload.weights == Weights::kResident ? est.weights : est.streamed;
  return w + acts + est.workspace <= device_plan.gpu_budget;
}

int64_t Trainer::Impl::LargestFittingSeqLength(int micro, int64_t cap) const {
  return LargestFittingLength(cap, [&](int64_t seq) { return FitsStreamed(micro, seq); });
}

std::string Trainer::Impl::WorkspaceParts(const MemoryEstimate& est) const {
  if (planner.shape_profile || (est.packed_attention == 0 && est.lsp == 0)) return "";
  std::string parts;
  if (est.packed_attention > 0) {
    parts += "packed records' attention at " + std::to_string(SeqLength()) + " tokens " +
             FormatByteSize(static_cast<uint64_t>(est.packed_attention));
  }
  if (est.lsp > 0) {
    parts += std::string(parts.empty() ? "" : ", ") +
             pipeline.lsp->WorkingSet().Describe(WeightResidency::kWindow + 2);
  }
  return " (of it " + parts + ")";
}

std::string Trainer::Impl::LargestBatchHint() const {
  // The sequence length priced too: at micro-batch 1, the largest max_seq_length that fits.
  const int64_t len = LargestFittingSeqLength(1, SeqLength() - 8);
  const std::string at_one =
      len > 0 ? "; at micro-batch 1 the largest max_seq_length that fits is " + std::to_string(len)
              : "; not even max_seq_length 8 fits at micro-batch 1";
  if (cfg.batch_size <= 1) return "; not even micro-batch 1 fits" + at_one;
  const int fits = LargestFittingMicroBatch(cfg.batch_size - 1);
  if (fits == 0) return "; not even micro-batch 1 fits at this max_seq_length" + at_one;
  return "; the largest micro-batch that fits is " + std::to_string(fits) +
         " (per_device_train_batch_size, with gradient_accumulation_steps to keep the global batch)";
}

int64_t Trainer::Impl::DeviceBudget() const {
  return cfg.offload.gpu_memory_limit > 0 ? static_cast<int64_t>(cfg.offload.gpu_memory_limit)
                                          : pipeline.streams->FreeMemory() * 9 / 10;
}

StatusOr<NodeProfile> Trainer::Impl::PlanNodeProfile() {
  if (planner.node_profile) return *planner.node_profile;
  const HostOptimizerOptions ho = HostOptions();
  bool cached = false;
  std::string cache_problem;
  ASSIGN_OR_RETURN(NodeProfile prof,
                   LoadOrMeasureNodeProfile(
                       cfg.profile_dir, static_cast<int>(ho.worker_processes * ho.worker_threads),
                       cfg.adamw_kernel, device, cfg.offload.nvme_dirs, &cached, &cache_problem));
  Log(TrainObserver::Level::kInfo, std::string("node profile (") + (cached ? "cached" : "measured") +
                                       "): " + DescribeNodeProfile(prof));
  if (!cache_problem.empty()) {
    Log(TrainObserver::Level::kWarning, "node profile " + cache_problem + " (--profile-dir " +
                                            cfg.profile_dir + "); it is measured again next run");
  }
  planner.node_profile = prof;
  return prof;
}

double Trainer::Impl::SecondsPerFlop(int64_t micro) {
  // Measured once per micro-batch: the candidates and lengths priced with it compare alike.
  if (auto it = planner.seconds_per_flop.find(micro); it != planner.seconds_per_flop.end())
    return it->second;
  // The MLP's up projection at this micro-batch's rows: the GEMMs are most of a decoder layer's
  // work, and their efficiency is what changes with the micro-batch. Capped where the rate has
  // long saturated (and where a CPU device would take seconds).
  const engine::ModelConfig& mc = model->config();
  const int64_t rows = std::min<int64_t>(micro * SeqLength(), cuda ? 16384 : 2048);
  const int64_t h = std::max<int64_t>(1, mc.hidden_size);
  const int64_t f = std::max<int64_t>(1, mc.intermediate_size);
  const auto opts = at::TensorOptions().device(device).dtype(dtype);
  const at::Tensor x = at::randn({rows, h}, opts), w = at::randn({h, f}, opts);
  at::Tensor y = at::mm(x, w);  // warm-up: library handles, kernel choice
  Synchronize(cuda);
  constexpr int kReps = 3;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) y = at::mm(x, w);
  Synchronize(cuda);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kReps;
  return planner.seconds_per_flop[micro] = secs / (2.0 * static_cast<double>(rows) *
                                                   static_cast<double>(h) * static_cast<double>(f));
}

namespace {

// Gives a block's parameters (and the ones it shares) random device values for as long as it
// lives, then puts back what was there (the loader's placeholders, or the trained weights).
class TemporaryWeights {
 public:
  // A streamed-out block's Params are undefined: their shapes come from the layout.
  TemporaryWeights(engine::Block& block, const at::TensorOptions& opts, const std::vector<BlockLayout>& layout) {
    auto install = [&](engine::Param& p) {
      std::vector<int64_t> shape;
      if (p.value.defined()) {
        shape = p.value.sizes().vec();
      } else {
        for (const auto& bl : layout) {
          for (const auto& slot : bl.params) {
            if (slot.param == &p) shape = slot.shape;
          }
        }
      }
      saved_.emplace_back(&p, p.value);
      p.value = at::randn(shape, opts).mul_(0.02);
    };
    for (auto& p : block.params()) install(p);
    for (engine::Param* p : block.shared_params()) install(*p);
  }
  ~TemporaryWeights() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) it->first->value = it->second;
  }
  TemporaryWeights(const TemporaryWeights&) = delete;
  TemporaryWeights& operator=(const TemporaryWeights&) = delete;

 private:
  std::vector<std::pair<engine::Param*, at::Tensor>> saved_;
};

}  // namespace

StatusOr<Trainer::Impl::BlockTiming> Trainer::Impl::TimeBlocks(int64_t micro, int64_t seq, int reps) {
  // The real kernels at the real shape: GEMMs, attention at this length (the fused kernels, or
  // attention within documents for packed batches), the elementwise kernels and the head's chunked
  // loss, which a flop count at one GEMM's rate leaves out (7B at micro-batch
  // 64 priced 28% optimistic). One decoder layer stands for all (they have one shape). Each
  // block runs once to warm up (kernel choice, cuDNN graphs for the shape), then twice timed;
  // the faster counts.
  c10::NoGradGuard no_grad;
  const engine::ModelConfig& mc = model->config();
  const auto opts = at::TensorOptions().device(device).dtype(dtype);
  const auto ids_opts = at::TensorOptions().dtype(at::kLong);
  at::Tensor ids = at::randint(mc.vocab_size, {micro, seq}, ids_opts);
  at::Tensor segments = Packed() ? at::zeros({micro, seq}, ids_opts) : at::Tensor();
  ASSIGN_OR_RETURN(engine::MicroBatch mb,
                   model->PrepareBatch(ids, ids, static_cast<double>(micro * seq), at::Tensor(), segments));
  const engine::GradCallback drop = [](const std::string&, const at::Tensor&) {};
  auto now = [this] {
    Synchronize(cuda);
    return std::chrono::steady_clock::now();
  };
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  BlockTiming t;
  // A mixture of experts: a sparse layer stands for the sparse ones and, when the model has
  // dense layers too, the first dense one for those.
  int sparse_block = 0, dense_block = 0;
  for (int b = 1; b + 1 < n; ++b) {
    if (SparseBlock(b) && sparse_block == 0) sparse_block = b;
    if (!SparseBlock(b) && dense_block == 0) dense_block = b;
  }
  t.mixed = sparse_block > 0 && dense_block > 0;
  const int layer_block = sparse_block > 0 ? sparse_block : 1;
  std::vector<int> timed_blocks{0, layer_block, n - 1};
  if (t.mixed) timed_blocks.push_back(dense_block);
  for (int b : timed_blocks) {
    engine::Block& block = model->block(b);
    TemporaryWeights temp(block, opts, layout);
    // As the step runs it: recomputed layers re-run their forward inside the backward.
    const engine::SaveMode mode = device_plan.modes[b] == engine::SaveMode::kRecompute
                                      ? engine::SaveMode::kRecompute
                                      : engine::SaveMode::kKeep;
    at::Tensor x = b == 0 ? at::Tensor() : at::randn({micro, seq, mc.hidden_size}, opts);
    double best_fwd = 1e30, best_bwd = 1e30, first_fwd = 0, first_bwd = 0;
    for (int rep = 0; rep < std::max(1, reps); ++rep) {
      engine::SavedState saved;
      const auto t0 = now();
      ASSIGN_OR_RETURN(at::Tensor y, block.Forward(mb, x, mode, &saved));
      const auto t1 = now();
      const at::Tensor dy = b == n - 1 ? at::Tensor() : at::randn_like(y);
      const auto t2 = now();
      ASSIGN_OR_RETURN(at::Tensor dx, block.Backward(mb, dy, &saved, drop));
      const auto t3 = now();
      (void)dx;
      if (rep == 0) {  // warm-up: what a step at a length not seen before pays once more
        first_fwd = secs(t0, t1);
        first_bwd = secs(t2, t3);
        continue;
      }
      best_fwd = std::min(best_fwd, secs(t0, t1));
      best_bwd = std::min(best_bwd, secs(t2, t3));
    }
    if (reps <= 1) continue;  // warmed only
    t.new_shape_forward_s += std::max(0.0, first_fwd - best_fwd);
    t.new_shape_backward_s += std::max(0.0, first_bwd - best_bwd);
    if (b == 0) t.embedding_s = best_fwd + best_bwd;
    if (b == layer_block) t.layer_forward_s = best_fwd, t.layer_backward_s = best_bwd;
    if (t.mixed && b == dense_block) t.dense_forward_s = best_fwd, t.dense_backward_s = best_bwd;
    if (b == n - 1) t.head_s = best_fwd + best_bwd;
  }
#if OFFLOADD_WITH_CUDA
  // What the timing cached is not the job's: free memory and the peaks are measured after it.
  Synchronize(cuda);
  if (cuda) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  return t;
}

Trainer::Impl::BatchMemory Trainer::Impl::FitBatchMemory(
    int micro, int64_t mem_T, const std::optional<ShapeProfile>& profiled, bool auto_states) const {
  BatchMemory m;
  m.est = EstimateMemory(micro, mem_T);
  const MemoryEstimate& est = m.est;
  std::vector<bool>& offloaded = m.offloaded;
  offloaded = device_plan.offload_checkpoint;
  int64_t acts = 0, offloaded_bytes = 0;
  for (int b = 0; b < n; ++b) {
    if (device_plan.modes[b] == engine::SaveMode::kKeep) acts += est.cost[b].saved_bytes_keep;
    if (device_plan.modes[b] == engine::SaveMode::kRecompute && !offloaded[b])
      acts += est.cost[b].saved_bytes_recompute;
    if (offloaded[b]) offloaded_bytes += est.cost[b].saved_bytes_recompute;
  }
  int64_t workspace =
      profiled ? profiled->workspace_bytes + kProfiledWorkspaceSlack : est.workspace;
  m.tiles = TilesAt(TileShapeAt(micro, mem_T), device_plan.tiles.mlp_tile_bytes,
                    device_plan.tiles.head_chunk_bytes);
  using Weights = OffloadPlanConfig::Weights;
  bool resident = !cuda || cfg.offload.weights == Weights::kResident ||
                  (cfg.offload.weights == Weights::kAuto && !auto_states);
  int64_t held = 0;
  if (cuda) {
    auto fits = [&](int64_t w) { return w + acts + workspace <= device_plan.gpu_budget; };
    if (resident && !fits(est.weights) && cfg.offload.weights != Weights::kResident) resident = false;
    const int64_t w = resident ? est.weights : est.streamed;
    for (int b = 1; b + 1 < n && !fits(w); ++b) {
      if (cfg.offload.layer_overrides.count(b - 1) ||
          cfg.offload.activations != ActivationMode::kAuto ||
          device_plan.modes[b] != engine::SaveMode::kRecompute || offloaded[b]) {
        continue;
      }
      offloaded[b] = true;
      acts -= est.cost[b].saved_bytes_recompute;
      offloaded_bytes += est.cost[b].saved_bytes_recompute;
    }
    if (!fits(w) && !profiled) {
      // Smaller MLP tiles and head chunks where the room left allows (PlanDevice applies them).
      const TileChoice t = ChooseTiles(TileShapeAt(micro, mem_T),
                                       device_plan.gpu_budget - (w + acts + workspace - est.tiles));
      if (t.from_budget) {
        workspace += t.bytes() - est.tiles;
        m.tiles = t;
      }
    }
    held = w + acts + workspace;
    if (!fits(w)) {
      m.why_not = "needs " + FormatByteSize(static_cast<uint64_t>(held)) +
                  " of GPU memory, gpu_memory_limit " +
                  FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget));
    }
  } else if (cfg.offload.host_memory_limit > 0 && static_cast<uint64_t>(acts) > cfg.offload.host_memory_limit / 2) {
    m.why_not = "its activations need " + FormatByteSize(static_cast<uint64_t>(acts)) +
                ", over half of host_memory_limit " + FormatByteSize(cfg.offload.host_memory_limit);
  }
  m.offloaded_bytes = offloaded_bytes;
  m.resident = resident;
  m.held = held;
  return m;
}

Trainer::Impl::BlockSeconds Trainer::Impl::PriceBlocks(
    const BatchMemory& mem, const std::optional<ShapeProfile>& profiled,
    const std::optional<BlockTiming>& timed, double spf, bool may_keep, int accumulation,
    PlanInputs* in, double expert_spf, std::pair<int64_t, int64_t> expert_shape) const {
  const MemoryEstimate& est = mem.est;
  const std::vector<bool>& offloaded = mem.offloaded;
  const double A = accumulation;
  const std::vector<int64_t> need = DeviceOptimizerNeeds(mem.resident, accumulation);
  BlockSeconds s;
  for (int b = 0; b < n; ++b) {
    const engine::BlockCost& c = est.cost[b];
    const bool recomputed = device_plan.modes[b] == engine::SaveMode::kRecompute;
    double f = 0, r = 0, total = 0;
    if (profiled) {
      f = profiled->blocks[b].forward_s;
      r = recomputed ? profiled->blocks[b].recompute_s : 0.0;
      total = f + profiled->blocks[b].backward_s;
    } else if (timed) {
      // The head's forward runs its own backward (its loss and gradients in chunks).
      const bool sparse = SparseBlock(b);
      f = b == 0 ? timed->embedding_s : b == n - 1 ? timed->head_s : timed->Forward(sparse);
      r = recomputed ? timed->Forward(sparse) : 0.0;
      total = b == 0 || b == n - 1 ? f : timed->Forward(sparse) + timed->Backward(sparse);
    } else {
      // A sparse layer's experts at the rate of their own GEMM shape, the rest (attention, the
      // router) at the dense GEMM's.
      const double experts =
          expert_spf > 0 ? LayerExpertFlops(b, expert_shape.first, expert_shape.second) : 0.0;
      f = (c.forward_flops - experts) * spf + experts * expert_spf;
      r = recomputed ? f : 0.0;
      // The head's cost counts its chunked backward inside its forward flops.
      total = b == n - 1 ? f : 3 * f + r;
    }
    s.forward += f;
    s.gpu += total;
    if (b == n - 1) s.head_forward = f;
    in->params.push_back(static_cast<int64_t>(layout[b].numel));
    in->device_state_bytes.push_back(need[b + 1] - need[b]);
    in->keep_extra_bytes.push_back(
        may_keep && recomputed && !offloaded[b]
            ? std::max<int64_t>(1, static_cast<int64_t>(
                                       kKeepSafety * static_cast<double>(c.saved_bytes_keep -
                                                                         c.saved_bytes_recompute)))
            : 0);
    in->recompute_seconds.push_back(A * r);
  }
  return s;
}

void Trainer::Impl::LogBlockTiming(int micro, int64_t T, double gpu, const BlockTiming& timed,
                                   const MemoryEstimate& est, double flop_rate_s) {
  double flops = 0;
  for (int b = 0; b < n; ++b) flops += (b == n - 1 ? 1 : 3) * est.cost[b].forward_flops;
  char buf[320];
  std::snprintf(
      buf, sizeof(buf),
      "batch size (auto): micro-batch %d timed at %lld tokens per row: GPU %.3f s per micro-batch "
      "(embedding %.1f ms, a decoder layer %.1f ms forward + %.1f ms backward, head %.1f ms); "
      "the flop count at the GEMM rate says %.3f s",
      micro, static_cast<long long>(T), gpu, 1e3 * timed.embedding_s, 1e3 * timed.layer_forward_s,
      1e3 * timed.layer_backward_s, 1e3 * timed.head_s, flops * flop_rate_s);
  std::string line = buf;
  if (timed.mixed) {  // a mixture of experts with dense layers: the decoder layer was a sparse one
    std::snprintf(buf, sizeof(buf), "; a dense layer %.1f ms forward + %.1f ms backward",
                  1e3 * timed.dense_forward_s, 1e3 * timed.dense_backward_s);
    line += buf;
  }
  Log(TrainObserver::Level::kInfo, line);
}

StatusOr<BatchCandidate> Trainer::Impl::PriceBatch(int micro, int accumulation,
                                                   const NodeProfile& prof, int64_t seq,
                                                   std::string* basis, int64_t memory_seq,
                                                   MoeStepFigures* moe) {
  const int64_t T = seq > 0 ? seq : SeqLength();
  const int64_t mem_T = memory_seq > 0 ? memory_seq : SeqLength();
  BatchCandidate cand;
  cand.micro = micro;
  cand.accumulation = accumulation;
  const double A = accumulation;
  // A cached shape profile was measured at SeqLength() tokens per row.
  const std::optional<ShapeProfile> profiled =
      T == SeqLength() ? CachedShapeProfile(micro) : std::optional<ShapeProfile>();
  const int64_t elem = c10::elementSize(dtype);
  const bool auto_states =
      cfg.offload.device_optimizer_blocks == OffloadPlanConfig::kAutoDeviceOptimizer &&
      cfg.offload.device_optimizer_share < 0;
  // Where the activations wait, as PlanDevice decides it at this micro-batch.
  const BatchMemory mem = FitBatchMemory(micro, mem_T, profiled, auto_states);
  if (!mem.why_not.empty()) {
    cand.why_not = mem.why_not;
    return cand;
  }
  cand.feasible = true;

  // GPU work: the cached shape profile's measured times at this micro-batch, else the flops of
  // the blocks' training step at the GEMM rate measured at its size.
  // Timed at this micro-batch's shape on the GPU; the CPU device prices flops at a GEMM's rate.
  std::optional<BlockTiming> timed;
  double flop_rate_s = 0;  // what the flop count at the GEMM rate said (logged beside the timing)
  if (cuda && !profiled) {
    flop_rate_s = SecondsPerFlop(micro);
    auto t = TimeBlocks(micro, T);
    if (!t.ok()) {
      if (t.status().code() != StatusCode::kResourceExhausted) return t.status();
      cand.feasible = false;
      cand.why_not = "one decoder layer's step ran out of GPU memory when timed at it";
      return cand;
    }
    timed = *t;
  }
  // The flop count at the GEMM rate: the blocks' estimates are at mem_T tokens per row.
  const double spf = profiled || timed ? 0
                                       : SecondsPerFlop(micro) * static_cast<double>(T) /
                                             static_cast<double>(mem_T);
  // A mixture of experts' expert GEMMs at their own shape's rate (ExpertSecondsPerFlop).
  const double expert_spf =
      spf > 0 && model->config().moe.num_experts > 0
          ? ExpertSecondsPerFlop(micro, T) * static_cast<double>(T) / static_cast<double>(mem_T)
          : 0.0;
  const bool may_keep = cuda && cfg.offload.activations == ActivationMode::kAuto &&
                        cfg.offload.layer_overrides.empty();
  PlanInputs in;
  const BlockSeconds blocks = PriceBlocks(mem, profiled, timed, spf, may_keep, accumulation, &in,
                                          expert_spf, {micro, mem_T});
  if (timed) LogBlockTiming(micro, T, blocks.gpu, *timed, mem.est, flop_rate_s);
  const double weight_bytes = static_cast<double>(mem.est.weights);
  const double params = weight_bytes / static_cast<double>(elem);
  in.budget_bytes = cuda ? device_plan.gpu_budget : 0;
  in.base_peak_bytes = mem.held;
  in.gpu_seconds = A * blocks.gpu;
  in.gpu_forward_seconds = A * blocks.forward;
  // Streamed weights cross twice per micro-batch (forward, backward), resident ones once per step
  // (the update); gradients leave per micro-batch; offloaded checkpoints go out and come back.
  SetParamTraffic(&in, !mem.resident, prof);
  AddNvmeLayerInputs(&in, micro, T, prof);
  if (cuda) {
    // Each upload moves what the device reads: the fp32 masters it casts, or the 16-bit copy.
    const double upload = in.h2d_saved_per_param / (mem.resident ? 1.0 : 2 * A);
    in.h2d_bytes = (mem.resident ? 1.0 : 2 * A) * upload * params +
                   A * static_cast<double>(mem.offloaded_bytes);
    // Data parallel: a rank copies out its reduce-scattered shard of the gradients.
    in.d2h_bytes = A * static_cast<double>(elem) * params / world() +
                   A * static_cast<double>(mem.offloaded_bytes);
  }
  in.host_bytes_per_s = prof.host_bytes_per_s;
  in.cpu_params_per_s = prof.cpu_params_per_s;
  in.cpu_params_per_s_during_dma = std::min(prof.cpu_params_per_s_during_dma, prof.cpu_params_per_s);
  in.h2d_bytes_per_s = prof.h2d_bytes_per_s > 0 ? prof.h2d_bytes_per_s : 1e30;
  in.d2h_bytes_per_s = prof.d2h_bytes_per_s > 0 ? prof.d2h_bytes_per_s : 1e30;
  in.place_states = cuda && auto_states;
  in.keep_activations = may_keep;
  in.held_updates = cfg.optim.max_grad_norm > 0 || scaler.has_value();
  if (in.held_updates && cuda) SetHeldTails(&in, blocks.head_forward);
  if (!cuda) in.budget_bytes = std::numeric_limits<int64_t>::max() / 4;
  ASSIGN_OR_RETURN(cand.plan, SolvePlan(in));
  // Data parallel: every rank trains its own micro-batches in the step (the group's rate).
  cand.tokens_per_s = CandidateTokensPerSecond(cand, T) * world();
  if (moe != nullptr) {
    // What each upload moves per parameter, as the H2D term above prices it.
    const double uploads = mem.resident ? 1.0 : 2 * A;
    *moe = PriceMoeStep(model->config(), micro, T, uploads, in.h2d_saved_per_param / uploads,
                        HostOptimizer::BytesPerParameter(HostOptions()));
  }
  if (basis != nullptr) {
    *basis = profiled  ? "the shape profile of " + profiled->measured_at + " on " + profiled->gpu
             : timed   ? "the embedding, a decoder layer and the head timed at " + std::to_string(micro) + "x" +
                           std::to_string(T) + " on the GPU"
                       : "the blocks' flop counts at the rate of a GEMM of the model's MLP shape";
    if (expert_spf > 0) {
      const MoeStepFigures m = PriceMoeStep(model->config(), micro, T, 0, 0, 0);
      *basis += ", the experts' at the rate of " +
                std::to_string(std::clamp<int64_t>(m.routed_experts, 1, 16)) + " expert GEMMs of " +
                std::to_string(std::max<int64_t>(1, std::llround(m.expert_rows))) + " rows";
    }
  }
  return cand;
}

Status Trainer::Impl::ChooseBatchSize() {
  if (!cfg.auto_batch_size) return OkStatus();
  const int cap = cfg.batch_size > 0 ? cfg.batch_size : kDefaultAutoBatchCap;
  if (!cfg.resume_from.empty()) {
    // A resumed run keeps the shape its checkpoint trained with: pricing again (other measured
    // rates, another node) could change the global batch in the middle of a run.
    ASSIGN_OR_RETURN(
        CheckpointReader r,
        CheckpointReader::Open(cfg.resume_from, "", cfg.optim.state_dtype, cfg.optim.master_dtype));
    if (const auto& kept = r.state().auto_batch) {
      if (kept->micro > cap || (cfg.global_batch_size > 0 && kept->micro * kept->accumulation != cfg.global_batch_size)) {
        return InvalidArgumentError(
            cfg.resume_from + " trained with micro-batch " + std::to_string(kept->micro) + " x " +
            std::to_string(kept->accumulation) + " (per_device_train_batch_size auto), which this job's " +
            (kept->micro > cap ? "cap of " + std::to_string(cap) : "train_batch_size " + std::to_string(cfg.global_batch_size)) +
            " contradicts");
      }
      cfg.batch_size = static_cast<int>(kept->micro);
      cfg.gradient_accumulation_steps = static_cast<int>(kept->accumulation);
      Log(TrainObserver::Level::kInfo, "batch size (auto): " + std::to_string(kept->micro) + " x " +
                                           std::to_string(kept->accumulation) + ", as " + cfg.resume_from +
                                           " trained (a resumed run keeps its shape)");
      return OkStatus();
    }
    Log(TrainObserver::Level::kWarning, cfg.resume_from + " does not record an automatic batch size (it was "
                                        "written by a run with a fixed one, or by an older build): pricing "
                                        "the candidates again");
  }
  RETURN_IF_ERROR(InitialModes());
  if (cuda) device_plan.gpu_budget = DeviceBudget();
  ASSIGN_OR_RETURN(const NodeProfile prof, PlanNodeProfile());
  ASSIGN_OR_RETURN(std::vector<BatchCandidate> candidates,
                   BatchCandidates(cap, cfg.global_batch_size, cfg.gradient_accumulation_steps));
  c10::NoGradGuard no_grad;
  std::string over;  // larger micro-batches need more of everything: none above one that does not fit
  for (BatchCandidate& c : candidates) {
    if (!over.empty()) {
      c.why_not = "above " + over;
      continue;
    }
    ASSIGN_OR_RETURN(c, PriceBatch(c.micro, c.accumulation, prof));
    if (!c.feasible) over = std::to_string(c.micro);
  }
  StatusOr<int> chosen = dp ? ChooseGroupBatch(dp.get(), &candidates) : ChooseBatch(candidates);
  if (!chosen.ok()) {
    if (chosen.status().code() != StatusCode::kResourceExhausted) return chosen.status();
    return ResourceExhaustedError("per_device_train_batch_size auto: " + std::string(chosen.status().message()) +
                                  "; raise gpu_memory_limit or lower max_seq_length");
  }
  const BatchCandidate& c = candidates[*chosen];
  const std::string group = !dp               ? ""
                            : dp->rank() == 0 ? " per rank, " + std::to_string(dp->world()) +
                                                    " ranks; tokens/s of the group"
                                              : " per rank, " + std::to_string(dp->world()) +
                                                    " ranks; rank 0's choice, this rank's prices";
  Log(TrainObserver::Level::kInfo,
      "batch size (auto" +
          (cfg.global_batch_size > 0 ? ", train_batch_size " + std::to_string(cfg.global_batch_size)
                                     : ", micro-batch at most " + std::to_string(cap)) +
          group + "): " + DescribeBatchChoice(candidates, *chosen, SeqLength()) +
          "; the step planner re-prices the placement with measured figures after the first steps");
  cfg.batch_size = c.micro;
  cfg.gradient_accumulation_steps = c.accumulation;
  return OkStatus();
}

}  // namespace offloadd::trainer
