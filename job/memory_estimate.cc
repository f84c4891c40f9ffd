#include "job/memory_estimate.h"

#include <algorithm>

#include "common/units.h"
#include "engine/head_chunk.h"
#include "engine/tiles.h"
#include "job/shape_profile.h"
#include "job/step_estimate.h"
#include "job/working_set.h"

namespace offloadd::daemon {
namespace {

uint64_t SatMul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
uint64_t SatAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

// A job across `hosts` hosts of `ranks_per_host` ranks: `in`, sized for the whole model, becomes
// one host's share (JobHostMemoryInputs in memory_estimate.h).
void SplitAcrossHosts(uint32_t hosts, uint32_t ranks_per_host, trainer::HostMemoryInputs* in) {
  // As Trainer::Impl::SliceLength slices them: each of the hosts x ranks_per_host ranks a chunk
  // of ceil(n / ranks), host h the chunks of its ranks; host 0's slice is the largest.
  const uint64_t ranks = uint64_t{hosts} * ranks_per_host;
  uint64_t whole = 0;
  for (uint64_t& n : in->optimizer.block_elements) {
    whole += n;
    n = std::min<uint64_t>(n, (n + ranks - 1) / ranks * ranks_per_host);
  }
  // The whole weights the ranks read (Trainer::Impl::full_weights), one copy per host, in the
  // dtype the device reads.
  in->device_fixed_bytes = whole * (trainer::ArenaWeightsAreFp32(in->optimizer) ? 4 : 2);
}

}  // namespace

ModelSize EstimateModelSize(const engine::ModelConfig& c) {
  // Counted from the model's parts (engine::CountParams): norms and their biases, q/k norms,
  // sandwich norms, projection and MLP biases, learned positions.
  const engine::ParamCounts n = engine::CountParams(c);
  ModelSize s;
  s.embedding_params = n.embedding;
  s.layer_params = n.layer;
  s.total_params = n.total;
  s.largest_block_params = std::max({s.embedding_params, s.layer_params, n.lm_head});
  s.layers = n.layers;
  return s;
}

std::vector<int64_t> BlockParams(const ModelSize& size, int64_t num_layers) {
  std::vector<int64_t> blocks{size.embedding_params};
  const bool each = static_cast<int64_t>(size.layers.size()) == num_layers;
  int64_t layers = 0;
  for (int64_t l = 0; l < std::max<int64_t>(0, num_layers); ++l) {
    const int64_t p = each ? size.layers[static_cast<size_t>(l)] : size.layer_params;
    blocks.push_back(p);
    layers += p;
  }
  blocks.push_back(std::max<int64_t>(0, size.total_params - size.embedding_params - layers));
  return blocks;
}

MemoryFloor EstimateMemoryFloor(const ModelSize& size, const engine::ModelConfig& c, int64_t batch,
                                int64_t seq_len, int compute_bytes) {
  MemoryFloor f;
  const uint64_t tokens = static_cast<uint64_t>(batch) * static_cast<uint64_t>(seq_len);
  const uint64_t cb = static_cast<uint64_t>(compute_bytes);
  // Two buffers for weights (one in use, the next arriving) and one for the block's gradients.
  const uint64_t weights = 2 * cb * static_cast<uint64_t>(size.largest_block_params);
  const uint64_t grads = cb * static_cast<uint64_t>(size.largest_block_params);
  // One layer's forward intermediates during its recomputation and backward: attention
  // projections, norms and the layer input/output (~ 8h per token), and the MLP's up/gate/
  // activation (~ 3i per token) over at most one sequence tile of rows (engine/tiles.h: a gated
  // MLP over more tokens runs in tiles).
  const uint64_t inter = static_cast<uint64_t>(c.intermediate_size > 0 ? c.intermediate_size : 4 * c.hidden_size);
  const bool gated = c.mlp != engine::MlpKind::kGeluMlp;
  const uint64_t mlp_rows =
      gated ? std::min<uint64_t>(tokens, static_cast<uint64_t>(engine::MlpTileRows(
                                             static_cast<int64_t>(inter), compute_bytes)))
            : tokens;
  const uint64_t layer_act = SatAdd(SatMul(tokens, 8 * static_cast<uint64_t>(c.hidden_size) * cb),
                                    SatMul(mlp_rows, 3 * inter * cb));
  // Checkpointed layer inputs are offloadable, so only the LM head is a floor. It runs over chunks
  // of tokens whose fp32 logits stay under kHeadChunkBytes (ops::LmHeadLoss); per chunk element:
  // the logits and their gradient in the compute dtype, and three fp32 buffers at the peak of
  // the loss (the upcast logits, their difference to the log-sum-exp, its exp). Beside them the
  // head's fp32 weight-gradient accumulator (vocab x hidden).
  // Saturating: a validated config has at most 2^50 parameters, but batch x seq x vocab can still
  // pass 2^64 for an absurd batch; the result must then read as "too large", not wrap around.
  const uint64_t vocab = static_cast<uint64_t>(c.vocab_size);
  const uint64_t chunk_tokens =
      std::max<uint64_t>(1, static_cast<uint64_t>(engine::kHeadChunkBytes) / std::max<uint64_t>(1, vocab * 4));
  const uint64_t head_tokens = std::min(tokens, chunk_tokens);
  const uint64_t logits = SatAdd(SatMul(SatMul(head_tokens, vocab), 2 * cb + 12),
                                 SatMul(vocab * 4, static_cast<uint64_t>(c.hidden_size)));
  f.gpu_bytes = SatAdd(SatAdd(weights, grads), SatAdd(layer_act, logits));
  f.gpu_breakdown = "double-buffered largest block " + FormatByteSize(weights) + ", its gradients " +
                    FormatByteSize(grads) + ", one layer's activations " + FormatByteSize(layer_act) +
                    ", LM head and loss " + FormatByteSize(logits) + " (logits in chunks of " +
                    std::to_string(head_tokens) + " tokens)";
  return f;
}

trainer::HostMemoryInputs JobHostMemoryInputs(const v1::JobSpec& spec, const engine::ModelConfig& config,
                                              const ModelSize& size, int compute_bytes, bool gpu) {
  trainer::HostMemoryInputs in;
  trainer::HostOptimizerOptions& o = in.optimizer;
  // Every block as the trainer lays it out: a sparse layer's states hold all its experts.
  for (int64_t p : BlockParams(size, config.num_layers))
    o.block_elements.push_back(static_cast<uint64_t>(p));
  const v1::ComputeDtype dt = spec.model().compute_dtype();
  o.compute = compute_bytes == 4 ? trainer::HostDtype::kFp32
              : dt == v1::COMPUTE_DTYPE_FP16 ? trainer::HostDtype::kFp16
                                             : trainer::HostDtype::kBf16;
  o.host_weight_copy = false;  // the trainer's default (TrainConfig::offload.host_weight_copy)
  o.accumulation_steps = static_cast<uint32_t>(std::max<int64_t>(1, spec.training().gradient_accumulation_steps()));
  o.tier = spec.offload().offload_optimizer().device() == v1::OFFLOAD_DEVICE_NVME ? trainer::StateTier::kNvme
                                                                                 : trainer::StateTier::kCpu;
  // The compact optimizer modes size the arena by their states (docs/optimizer-modes.md).
  const v1::StateDtype state = spec.optimizer().state_dtype();
  o.mode.state = state == v1::STATE_DTYPE_INT8   ? workers::StateDtype::kInt8
                 : state == v1::STATE_DTYPE_BF16 ? workers::StateDtype::kBf16
                                                 : workers::StateDtype::kFp32;
  o.mode.master = spec.optimizer().master_dtype() == v1::MASTER_DTYPE_BF16
                      ? workers::MasterDtype::kBf16
                      : workers::MasterDtype::kFp32;
  // offload_param: nvme puts every NVMe block's 16-bit weights in the store too (the trainer's
  // OffloadPlanConfig::ParamTier::kNvme).
  in.nvme_weights_allowed = in.nvme_weights_forced =
      spec.offload().offload_param().device() == v1::OFFLOAD_DEVICE_NVME;
  in.cuda = gpu;
  in.micro = std::max<int64_t>(1, spec.training().per_device_train_batch_size());
  // Across hosts (ZeRO-1, trainer/trainer_hosts.cc) one host's share, the largest.
  const auto& res = spec.resources();
  if (res.hosts() > 1)
    SplitAcrossHosts(res.hosts(), std::max<uint32_t>(1, res.gpus_per_host()), &in);
  return in;
}

v1::StepEstimate StepEstimateUnavailable(const std::string& why) {
  v1::StepEstimate out;
  out.set_text("no estimate: " + why);
  return out;
}

v1::StepEstimate EstimateJobStep(const std::string& profile_dir, const std::string& gpu,
                                 const engine::ModelConfig& config, const ModelSize& size,
                                 int64_t micro, int64_t accumulation, int64_t seq_len,
                                 int compute_bytes, bool held_updates, int64_t nvme_params,
                                 bool weights_fp32) {
  v1::StepEstimate out;
  trainer::StepEstimateInputs in;
  in.block_params = BlockParams(size, config.num_layers);
  in.micro = micro;
  in.accumulation = accumulation;
  in.seq = seq_len;
  in.compute_bytes = compute_bytes;
  in.gpu = !gpu.empty();
  in.held_updates = held_updates;
  in.nvme_params = nvme_params;
  in.weights_fp32 = weights_fp32;
  if (!profile_dir.empty()) {
    auto prof = trainer::ReadNodeProfile(profile_dir + "/" + trainer::kNodeProfileFile);
    if (prof.ok()) in.node = *prof;
    // The fingerprint's prefix, as ProfiledGpuFloor matches it.
    const std::string model = config.model_type + "/" + std::to_string(config.num_layers + 2) + " layers/" +
                              std::to_string(size.total_params) + " params/";
    in.shape = trainer::FindShapeProfile(profile_dir, in.gpu ? gpu : "cpu", model, micro, seq_len, compute_bytes);
  }
  auto e = trainer::EstimateStep(in);
  if (!e.ok()) {
    out.set_text("no estimate: " + std::string(e.status().message()));
    return out;
  }
  out.set_available(true);
  out.set_lower_bound(e->lower_bound);
  out.set_step_seconds(e->step_seconds);
  out.set_tokens_per_second(e->tokens_per_second);
  out.set_bound(e->bound);
  out.set_basis(e->basis);
  out.set_text(e->text);
  return out;
}

}  // namespace offloadd::daemon

namespace offloadd::daemon {

int64_t LargestBatchWithin(const ModelSize& size, const engine::ModelConfig& config, int64_t seq_len,
                           int compute_bytes, uint64_t gpu_bytes, int64_t max_batch) {
  // The floor grows with the batch (activations and, up to a chunk, logits), so bisect.
  auto fits = [&](int64_t b) {
    return EstimateMemoryFloor(size, config, b, seq_len, compute_bytes).gpu_bytes <= gpu_bytes;
  };
  if (max_batch < 1 || !fits(1)) return 0;
  int64_t lo = 1, hi = max_batch;  // fits(lo)
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid; else hi = mid - 1;
  }
  return lo;
}

int64_t LargestSeqLengthWithin(const ModelSize& size, const engine::ModelConfig& config,
                               int64_t batch, int compute_bytes, uint64_t gpu_bytes,
                               int64_t max_len) {
  return trainer::LargestFittingLength(max_len, [&](int64_t seq) {
    return EstimateMemoryFloor(size, config, batch, seq, compute_bytes).gpu_bytes <= gpu_bytes;
  });
}

std::optional<ProfiledFloor> ProfiledGpuFloor(const std::string& profile_dir, const std::string& gpu,
                                              const engine::ModelConfig& config, const ModelSize& size,
                                              int64_t batch, int64_t seq_len, int compute_bytes) {
  if (profile_dir.empty()) return std::nullopt;
  // trainer::ModelFingerprint: "<architecture>/<blocks> layers/<params> params/<hash>"; the blocks
  // are the embedding, the decoder layers and the head.
  const std::string model = config.model_type + "/" + std::to_string(config.num_layers + 2) + " layers/" +
                            std::to_string(size.total_params) + " params/";
  const char* dtype = compute_bytes == 4 ? "Float" : "BFloat16";
  for (const auto& p : trainer::ListShapeProfiles(profile_dir, nullptr)) {  // newest first
    if (p.gpu != gpu || p.model.rfind(model, 0) != 0 || p.batch != batch || p.seq != seq_len ||
        (p.dtype != dtype && !(compute_bytes == 2 && p.dtype == "Half"))) {
      continue;
    }
    constexpr uint64_t kMargin = uint64_t{256} << 20;
    const uint64_t weights = 3 * static_cast<uint64_t>(size.largest_block_params) * static_cast<uint64_t>(compute_bytes);
    ProfiledFloor f;
    f.gpu_bytes = static_cast<uint64_t>(p.workspace_bytes) + weights + kMargin;
    f.source = "measured on this node: the shape profile of " + p.measured_at + " on " + p.gpu + " (working set " +
               FormatByteSize(static_cast<uint64_t>(p.workspace_bytes)) + " + weight buffers " + FormatByteSize(weights) +
               " + a 256 MiB margin; checkpoints may wait in pinned RAM)";
    return f;
  }
  return std::nullopt;
}

}  // namespace offloadd::daemon
