// Trainer setup: model placeholders, data, the device plan (weight residency and activation
// modes under the GPU budget), the host arena with initial weights, and the first upload.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>

#include "common/units.h"
#include "ipc/liveness.h"
#include "job/arena_layout.h"
#include "job/checkpoint_placement.h"
#include "trainer/pipeline/trace.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {
namespace {

StatusOr<c10::Device> ParseDevice(const std::string& s) {
  if (s == "cpu") return c10::Device(c10::kCPU);
  if (s == "cuda") return c10::Device(c10::kCUDA, 0);
  if (s.rfind("cuda:", 0) == 0) {
    try {
      return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(std::stoi(s.substr(5))));
    } catch (const std::exception&) {
    }
  }
  return InvalidArgumentError("device must be cpu, cuda or cuda:N, got '" + s + "'");
}

std::string ShortNumber(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

uint32_t UsableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

}  // namespace

void Trainer::Impl::Log(TrainObserver::Level level, const std::string& message) {
  if (obs) obs->OnLog(level, message);
}

namespace {

// Pieces of the initial weights read on separate threads: whole parameters for a random
// initialisation (drawn whole from per-parameter generators), else slices of at most kPiece
// elements, so that the embedding and the large matrices spread over the threads too.
std::vector<HostOptimizer::InitPiece> InitPieces(const std::vector<BlockLayout>& layout,
                                                 bool sliced) {
  constexpr uint64_t kPiece = uint64_t{16} << 20;
  std::vector<HostOptimizer::InitPiece> pieces;
  for (int b = 0; b < static_cast<int>(layout.size()); ++b) {
    for (const auto& slot : layout[b].params) {
      const uint64_t step = sliced && !slot.compressed ? kPiece : std::max<uint64_t>(1, slot.numel);
      for (uint64_t at = 0; at < slot.numel; at += step) {
        pieces.push_back({b, slot.offset + at, std::min(step, slot.numel - at)});
      }
    }
  }
  return pieces;
}

}  // namespace

Status Trainer::Impl::Setup() {
  RETURN_IF_ERROR(CheckConfig());
  {
    SetupPhase t(setup_timing, 1);
    RETURN_IF_ERROR(LoadModel());
  }
  {
    SetupPhase t(setup_timing, 0);
    ASSIGN_OR_RETURN(pipeline.streams, DeviceStreams::Create(device));
  }
  {
    SetupPhase t(setup_timing, 3);
    // The group first: with data parallelism the ranks agree on the automatic batch.
    RETURN_IF_ERROR(StartGroup());
    RETURN_IF_ERROR(ChooseBatchSize());
  }
  {
    SetupPhase t(setup_timing, 2);
    RETURN_IF_ERROR(CreateData());
  }
  bool resident = false;
  {
    SetupPhase t(setup_timing, 3);
    ASSIGN_OR_RETURN(resident, PlanDevice());
    RETURN_IF_ERROR(CheckHostMemory());  // refused with numbers, never OOM-killed
    if (cfg.validate_only) return PredictStep();  // no arena, no step
    RETURN_IF_ERROR(StartSpill());
  }

  const HostOptimizerOptions ho = HostOptions();
  // The workers' and the store's liveness deadlines scale with the node profile's rates
  // (ipc/liveness.h; the executor set the floor and factor).
  if (planner.node_profile) {
    ipc::SetLivenessRates(planner.node_profile->cpu_params_per_s,
                          std::min(planner.node_profile->store_read_bytes_per_s,
                                   planner.node_profile->store_write_bytes_per_s));
  }
  RETURN_IF_ERROR(CreateHostOptimizer(ho));
  // With cfg.setup_overlap the arena is populated in the background from here (HostOptimizer::
  // WaitPopulated): the workers start, block b's masters are filled once its pages are in, and the
  // device set-up runs while the moments and the rest are populated.
  setup_timing.set_arena_in_background(host && host->populating_in_background());
  if (host && host->workers_end() > host->workers_start()) {
    setup_timing.Add(5, host->workers_start(), host->workers_end());
  }
  {
    SetupPhase t(setup_timing, 6);
    const std::vector<HostOptimizer::InitPiece> pieces =
        InitPieces(layout, model->has_checkpoint());
    auto fill = [&](const HostOptimizer::InitPiece& piece, float* dst) -> Status {
      // The slots of the piece's block overlapping it (one, unless a random value is whole).
      for (const auto& slot : layout[piece.block].params) {
        const uint64_t lo = std::max(slot.offset, piece.begin);
        const uint64_t hi = std::min(slot.offset + slot.numel, piece.begin + piece.count);
        if (lo >= hi) continue;
        float* out = dst + (lo - piece.begin);
        if (slot.compressed) {  // LSP subspace coordinates start at zero: W = W_base
          std::memset(out, 0, (hi - lo) * sizeof(float));
          continue;
        }
        RETURN_IF_ERROR(model->ReadInitialValueInto(slot.param->name,
                                                    static_cast<int64_t>(lo - slot.offset),
                                                    static_cast<int64_t>(hi - lo), out));
      }
      return OkStatus();
    };
    if (across_hosts()) {  // this host's slice of the masters, and every block's whole weights
      RETURN_IF_ERROR(InitializeAcrossHosts(pieces, fill));
    } else {
      RETURN_IF_ERROR(host->InitializePieces(pieces, fill, SetupThreads()));
    }
  }
  {
    SetupPhase t(setup_timing, 7);
    if (pipeline.lsp) RETURN_IF_ERROR(pipeline.lsp->Initialize(*model));
    RETURN_IF_ERROR(StartDeviceOptimizer());
    RETURN_IF_ERROR(PinHostBuffers());
    RETURN_IF_ERROR(StartPipeline(resident));
  }
  if (host) {
    RETURN_IF_ERROR(host->WaitPopulated());
    if (host->arena_end() > host->arena_start())
      setup_timing.Add(4, host->arena_start(), host->arena_end());
  }
  pipeline.accounting->SetSetup(setup_timing.created(), setup_timing.seconds(),
                                setup_timing.starts());
  device_plan.plan_text = DescribePlan(ho);
  Log(TrainObserver::Level::kInfo, "plan: " + device_plan.plan_text);
  {  // which part of the decoder layers runs a fused kernel and which fell back to LibTorch ops
    std::string parts;
    for (const std::string& p : model->DescribeKernels(device, dtype, SeqLength())) {
      parts += (parts.empty() ? "" : "; ") + p;
    }
    if (!parts.empty()) Log(TrainObserver::Level::kInfo, "model parts: " + parts);
  }
  Log(TrainObserver::Level::kInfo,
      setup_timing.Describe(
          SetupThreads(),
          host ? std::optional<uint64_t>(host->segment().total_size()) : std::nullopt));
  if (const std::string d = engine::DescribeDropout(model->config()); !d.empty()) {
    Log(TrainObserver::Level::kWarning,
        "training WITHOUT dropout (dropout: disable): the model's config.json sets " + d +
            ", which is not applied");
  }
  Log(TrainObserver::Level::kInfo, "data: " + data->Describe());
  if (eval.data) {
    Log(TrainObserver::Level::kInfo,
        "eval data (every " + std::to_string(cfg.eval_steps) + " steps): " + eval.data->Describe());
  }
  return OkStatus();
}

Status Trainer::Impl::CreateData() {
  // Data parallel: every rank reads the same global micro-batches (batch_size rows per rank) and
  // trains on its rows, so the loss normaliser and the padding are those of one executor on the
  // whole batch.
  const int32_t global_micro = cfg.batch_size * world();
  ASSIGN_OR_RETURN(data, DataSource::Create(cfg.data, cfg.model_dir, model->config().vocab_size,
                                            global_micro, cfg.seed));
  if (!cfg.eval_data.paths.empty() || !cfg.eval_data.mixture.empty()) {
    if (cfg.eval_steps < 1) {
      return InvalidArgumentError("eval data given without eval_steps (evaluate every N steps, N >= 1)");
    }
    DataConfig ec = cfg.eval_data;
    ec.shuffle = false;
    ASSIGN_OR_RETURN(eval.data, DataSource::Create(ec, cfg.model_dir, model->config().vocab_size,
                                                   cfg.batch_size, cfg.seed));
    eval.start = eval.data->State();
  } else if (cfg.eval_steps > 0) {
    return InvalidArgumentError("eval_steps " + std::to_string(cfg.eval_steps) + " given without eval data");
  }
  total = TotalSteps(cfg.max_steps, cfg.num_train_epochs, data->sequences_per_epoch(),
                     global_micro, cfg.gradient_accumulation_steps);
  ASSIGN_OR_RETURN(LrSchedule sched,
                   LrSchedule::Create(cfg.optim.lr_scheduler_type, cfg.optim.warmup_steps,
                                      cfg.optim.warmup_ratio, total,
                                      {cfg.optim.num_cycles, cfg.optim.min_lr_rate}));
  lr_schedule = sched;
  return OkStatus();
}

uint32_t Trainer::Impl::SetupThreads() const {
  return cfg.setup_threads > 0 ? cfg.setup_threads : UsableCpus();
}

Status Trainer::Impl::PinHostBuffers() {
  // What WeightResidency and StepSchedule page-lock block by block (their Pin finds these done):
  // every block's gradient staging buffer, and the weights the device reads (16-bit copies or fp32
  // masters) of blocks not on the device.
  std::vector<std::pair<void*, size_t>> ranges;
  for (int b = 0; b < n; ++b) {
    ranges.emplace_back(host->grad_staging(b), host->grad_staging_bytes(b));
    const bool on_device = pipeline.device_opt &&
                           b < static_cast<int>(device_plan.device_blocks.size()) &&
                           device_plan.device_blocks[b];
    // A block whose weights are on NVMe has none in the arena: the device copies read the two
    // weight buffers (WeightResidency).
    if (!on_device && host->compute_weights(b) != nullptr)
      ranges.emplace_back(host->compute_weights(b), host->compute_weight_bytes(b));
  }
  for (int i = 0; i < HostOptimizer::kWeightBuffers && host->weight_buffer_bytes() > 0; ++i)
    ranges.emplace_back(host->weight_buffer(i), host->weight_buffer_bytes());
  return pipeline.streams->PinAll(ranges, SetupThreads());
}

Status Trainer::Impl::CheckConfig() {
  ASSIGN_OR_RETURN(device, ParseDevice(cfg.device));
  cuda = device.is_cuda();
  const std::string& cd = cfg.compute_dtype;
  if (cd == "auto") {
    dtype = cuda ? c10::kBFloat16 : c10::kFloat;
  } else if (cd == "fp32") {
    dtype = c10::kFloat;
  } else if (cd == "bf16") {
    dtype = c10::kBFloat16;
  } else if (cd == "fp16") {
    dtype = c10::kHalf;
    RETURN_IF_ERROR(GradScaler::Validate(cfg.loss_scale));
    scaler.emplace(cfg.loss_scale);
  } else {
    return InvalidArgumentError("compute dtype must be auto, fp32, bf16 or fp16, got '" + cd + "'");
  }
  // NaN compares false with everything: a NaN max_grad_norm would silently turn clipping off.
  for (const auto& [name, v] : {std::pair{"learning_rate", cfg.optim.learning_rate},
                                std::pair{"max_grad_norm", cfg.optim.max_grad_norm},
                                std::pair{"weight_decay", cfg.optim.weight_decay},
                                std::pair{"warmup_ratio", cfg.optim.warmup_ratio},
                                std::pair{"adam_epsilon", cfg.optim.eps},
                                std::pair{"num_train_epochs", cfg.num_train_epochs}}) {
    if (!std::isfinite(v)) {
      return InvalidArgumentError(std::string(name) + " must be a finite number, got " +
                                  std::to_string(v));
    }
  }
  // The speculation default (train_config.h): on a GPU the CPU updates overlap the backward under
  // exact clipping; on the CPU, runs stay bitwise reproducible.
  if (cfg.optim.speculation.empty()) {
    cfg.optim.speculation = cuda ? "auto" : "never";
    speculation_defaulted = true;
  }
  RETURN_IF_ERROR(workers::ParseSpeculation(cfg.optim.speculation).status());
  RETURN_IF_ERROR(CheckOptimizerMode());
  RETURN_IF_ERROR(CheckParamTier());
  // Padded lengths in buckets on a GPU (train_config.h DataConfig::length_buckets); the eval data
  // pads the same way.
  if (!cfg.data.length_buckets) cfg.data.length_buckets = cuda;
  cfg.eval_data.length_buckets = cfg.data.length_buckets;
  if (cfg.batch_size < 1) return InvalidArgumentError("batch size must be at least 1");
  if (cfg.gradient_accumulation_steps < 1)
    return InvalidArgumentError("gradient_accumulation_steps must be at least 1");
  if (cfg.global_batch_size < 0) {
    return InvalidArgumentError("train_batch_size must be positive, got " + std::to_string(cfg.global_batch_size));
  }
  if (cfg.global_batch_size > 0 && !cfg.auto_batch_size &&
      cfg.global_batch_size != cfg.batch_size * cfg.gradient_accumulation_steps) {
    return InvalidArgumentError("train_batch_size " + std::to_string(cfg.global_batch_size) +
                                " is not per_device_train_batch_size x gradient_accumulation_steps (" +
                                std::to_string(cfg.batch_size) + " x " +
                                std::to_string(cfg.gradient_accumulation_steps) +
                                "); set one of them, or per_device_train_batch_size auto");
  }
  if (cfg.worker_binary.empty()) return InvalidArgumentError("no offloadd-worker binary given");
  if (cfg.lsp.enabled) {
    // What LSP mode is built and tested on so far; the rest is refused rather than half-supported.
    if (cuda && dtype != c10::kBFloat16) {
      return InvalidArgumentError("LSP compression on CUDA computes in bf16 (compute_dtype auto or bf16)");
    }
    if (!cuda && dtype != c10::kFloat) return InvalidArgumentError("LSP compression on the CPU computes in fp32");
    if (cfg.offload.tier != StateTier::kCpu)
      return UnimplementedError("LSP compression keeps its subspace states in RAM; the NVMe tier is not supported with it");
    if (cfg.auto_batch_size) {
      return UnimplementedError("per_device_train_batch_size auto does not price LSP compression yet; set a "
                                "micro-batch");
    }
    if (cfg.offload.device_optimizer_share >= 0) {
      return UnimplementedError("LSP compression updates every subspace on the CPU: offload_optimizer.ratio "
                                "is not supported with it (device_optimizer_blocks 0 or 1 places the "
                                "embedding's AdamW states)");
    }
  }
  return OkStatus();
}

Status Trainer::Impl::LoadModel() {
  engine::LoadOptions lo;
  lo.dtype = dtype;
  lo.materialize = cfg.random_init ? engine::LoadOptions::Materialize::kRandom
                                   : engine::LoadOptions::Materialize::kLazy;
  lo.random_seed = cfg.seed;
  ASSIGN_OR_RETURN(model, engine::Model::Load(cfg.model_dir, lo));
  RETURN_IF_ERROR(engine::DropoutProblem(model->config(), cfg.dropout_disabled));
  model->AssumePlacement(device, dtype);
  n = model->num_blocks();
  layout.resize(n);
  for (int b = 0; b < n; ++b) {
    auto& bl = layout[b];
    for (auto& p : model->block(b).params()) {
      ParamSlot slot;
      slot.param = &p;
      slot.shape = p.value.sizes().vec();
      slot.numel = static_cast<uint64_t>(p.value.numel());
      slot.offset = bl.numel;
      bl.numel += slot.numel;
      bl.params.push_back(slot);
    }
  }
  if (cfg.lsp.enabled) {
    ASSIGN_OR_RETURN(pipeline.lsp,
                     LspMode::Create(cfg.lsp, cfg.seed, model.get(), &layout, device, dtype));
  }
  return OkStatus();
}

// offload_param on NVMe (OffloadPlanConfig::ParamTier): refused, by name, where it cannot act.
Status Trainer::Impl::CheckParamTier() const {
  if (cfg.offload.param_tier == OffloadPlanConfig::ParamTier::kCpu) return OkStatus();
  const std::string what =
      std::string("the 16-bit weights on NVMe (offload_param.device ") +
      (cfg.offload.param_tier == OffloadPlanConfig::ParamTier::kNvme ? "nvme, --param-tier=nvme)"
                                                                     : "auto, --param-tier=auto)");
  if (cfg.offload.tier != StateTier::kNvme) {
    return InvalidArgumentError(
        what +
        " need the optimizer states on NVMe (offload_optimizer.device nvme, "
        "--tier=nvme): only a block whose states are in the store keeps its "
        "weights there");
  }
  if (dtype == c10::kFloat) {
    return InvalidArgumentError(
        what +
        " need 16-bit compute (bf16 or fp16, --dtype): with fp32 compute the "
        "device reads the fp32 masters");
  }
  if (cfg.parallel.world_size > 1)
    return InvalidArgumentError(what + " are not available with data parallelism");
  if (cfg.lsp.enabled)
    return InvalidArgumentError(what + " are not available with LSP compression");
  return OkStatus();
}

HostOptimizerOptions Trainer::Impl::HostOptions() const {
  HostOptimizerOptions ho;
  for (const auto& bl : layout) ho.block_elements.push_back(bl.numel);
  ho.compute = dtype == c10::kBFloat16 ? HostDtype::kBf16
               : dtype == c10::kHalf    ? HostDtype::kFp16
                                        : HostDtype::kFp32;
  ho.skip_nonfinite = scaler.has_value();
  ho.accumulation_steps = static_cast<uint32_t>(cfg.gradient_accumulation_steps);
  ho.optim = cfg.optim;
  ho.tier = cfg.offload.tier;
  ho.nvme_dirs = cfg.offload.nvme_dirs;
  ho.nvme_queue_depth = cfg.offload.nvme_queue_depth;
  ho.nvme_block_size = cfg.offload.nvme_block_size;
  // Update order: earliest-needed-first dispatch (workers/step_driver.h), unless a transition
  // layer asks for LSP-Offload's static FCFS/LCFS schedule (blocks below it held to the end).
  ho.defer_below_block = cfg.offload.transition_layer >= 0 ? cfg.offload.transition_layer + 1 : 0;
  ho.update_depth = cfg.offload.update_depth;
  ho.worker_binary = cfg.worker_binary;
  ho.store_binary = cfg.store_binary;
  ho.worker_processes = std::max<uint32_t>(1, cfg.worker_processes);
  ho.worker_threads = cfg.worker_threads > 0
                          ? cfg.worker_threads
                          : std::max<uint32_t>(1, UsableCpus() / ho.worker_processes);
  ho.kernel_path = cfg.adamw_kernel;
  ho.host_memory_limit = cfg.offload.host_memory_limit;
  ho.host_weight_copy = cfg.offload.host_weight_copy;
  ho.populate_threads = SetupThreads();
  ho.populate_in_background = cfg.setup_overlap;
  ho.device_blocks = device_plan.device_blocks;
  ho.nvme_blocks = device_plan.nvme_blocks;
  ho.nvme_weight_blocks = device_plan.nvme_weight_blocks;
  ho.mode = optimizer_mode;
  return ho;
}

std::string Trainer::Impl::DescribePlan(const HostOptimizerOptions& ho) const {
  std::ostringstream text;
  text << "device " << device.str() << " (" << c10::toString(dtype) << "), " << n << " blocks, "
       << (pipeline.weights->resident()
               ? "weights resident"
               : "weights streamed " + std::to_string(WeightResidency::kWindow) + " ahead")
       << ", activations";
  std::map<std::string, int> counts;
  for (int b = 1; b + 1 < n; ++b)
    counts[device_plan.spill_nvme[b]        ? "offload_nvme"
           : device_plan.checkpoint_nvme[b] ? "recompute_offload_nvme"
           : device_plan.offload_checkpoint[b]
               ? "recompute_offload_cpu"
               : std::string(engine::SaveModeName(device_plan.modes[b]))]++;
  for (const auto& [m, c] : counts) text << " " << m << "x" << c;
  bool masters_in_ram = false;  // the NVMe tier's blocks in RAM: the device reads their masters
  for (int b = 0; b < n; ++b)
    masters_in_ram |= internal::BlockWeightsFp32(ho, static_cast<size_t>(b));
  text << "; optimizer states in "
       << (cfg.offload.tier != StateTier::kNvme ? "RAM"
           : device_plan.state_placement_text.empty()
               ? "NVMe"
               : "RAM and NVMe: " + device_plan.state_placement_text)
       << (device_plan.state_placement_text.empty() && !device_plan.weight_placement_text.empty()
               ? " (" + device_plan.weight_placement_text + ")"
               : "")
       << ", arena " << FormatByteSize(HostOptimizer::ArenaBytes(ho)) << " ("
       << HostOptimizer::BytesPerParameter(ho) << " B/parameter, weights "
       << (dtype == c10::kFloat                ? "fp32"
           : HostOptimizer::WeightsAreFp32(ho) ? "cast on the device from the fp32 masters"
           : masters_in_ram ? "cast on the device from the fp32 masters of the blocks in RAM, "
                              "a 16-bit copy of the NVMe blocks'"
           : ho.mode.master == workers::MasterDtype::kBf16 ? "the bf16 master itself"
                                                           : "16-bit copy in RAM")
       << "), " << ho.worker_processes << "x" << ho.worker_threads
       << " worker threads, AdamW kernel " << host->kernel_description() << ", updates "
       << (ho.defer_below_block > 0
               ? "FCFS above block " + std::to_string(ho.defer_below_block) + ", LCFS below"
               : std::string("earliest-needed first"))
       << " (" << ho.update_depth << " queued per worker), optimizer " << optimizer_mode.Describe();
  if (!optimizer_mode.Exact()) {
    text << " (" << ShortNumber(workers::StateBytesPerParam(optimizer_mode))
         << " B/parameter of master and states, on the host and on the device alike)";
  }
  if (device_plan.device_placement_pending) {
    text << "; AdamW states on the device: as many blocks as fit beside the first step's measured "
            "peak";
  } else if (pipeline.device_opt) {
    text << "; AdamW states of blocks 0-" << pipeline.device_opt->count() - 1 << " on the device ("
         << pipeline.device_opt->params() << " parameters, "
         << FormatByteSize(
                static_cast<uint64_t>(static_cast<double>(pipeline.device_opt->params()) *
                                      workers::StateBytesPerParam(optimizer_mode)))
         << ")";
  }
  text << "; " << DescribeClipping(ho);
  if (pipeline.lsp) text << "; " << pipeline.lsp->Describe();
  text << "; " << total << " steps";
  if (scaler) {
    text << "; dynamic loss scale from " << scaler->scale() << " (x" << cfg.loss_scale.growth_factor
         << " every " << cfg.loss_scale.growth_interval << " clean steps, x"
         << cfg.loss_scale.backoff_factor << " on overflow)";
  }
  if (cuda)
    text << "; GPU budget " << FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget));
  text << "; "
       << TilesAt(TileShapeAt(cfg.batch_size, SeqLength()), device_plan.tiles.mlp_tile_bytes,
                  device_plan.tiles.head_chunk_bytes)
              .Describe()
       << " at " << SeqLength() << " tokens per row";
  if (device_plan.tiles.from_budget) text << " (from the GPU budget)";
  return text.str();
}

std::string Trainer::Impl::DescribeClipping(const HostOptimizerOptions& ho) const {
  if (cfg.optim.max_grad_norm <= 0) return "no clipping: updates start as gradients land";
  std::string out =
      "clipping at max_grad_norm " + ShortNumber(cfg.optim.max_grad_norm) + ", speculation ";
  if (!ho.mode.Exact()) {
    return out +
           "never (compact states cannot be corrected after an update: every update waits "
           "for the step's norm)";
  }
  if (ho.tier == StateTier::kNvme || ho.skip_nonfinite) {
    return out + "never (" + (ho.skip_nonfinite ? "fp16 loss scaling" : "the NVMe tier") +
           " holds every update until the step's norm is known)";
  }
  out += cfg.optim.speculation;
  if (speculation_defaulted) {
    out += cuda ? " (the GPU default: runs equal within fp32 rounding; speculation never for "
                  "bitwise ones)"
                : " (the CPU default: bitwise reproducible)";
  }
  return out;
}

StatusOr<bool> Trainer::Impl::PlanDevice() {
  RETURN_IF_ERROR(InitialModes());
  planner.shape_profile = CachedShapeProfile(cfg.batch_size);
  if (planner.shape_profile) {
    Log(TrainObserver::Level::kInfo, "shape profile cached " + planner.shape_profile->measured_at +
                                         " (" + planner.shape_profile->key + ")");
  }
  if (!cuda) {
    RETURN_IF_ERROR(PlanDeviceOptimizer(true, 0));
    return true;
  }

  const MemoryEstimate est = EstimateMemory(cfg.batch_size);
  const std::vector<engine::BlockCost>& cost = est.cost;
  const int64_t weight_bytes = est.weights;
  device_plan.gpu_budget = DeviceBudget();
  int64_t workspace = est.workspace;  // LSP's and packed attention's included (EstimateMemory)
  if (planner.shape_profile) {
    // Measured on this GPU for this model and micro-batch shape: the step's working set beyond
    // what that run's plan held, plus room for the allocator's placement to differ between runs.
    const int64_t measured = planner.shape_profile->workspace_bytes + kProfiledWorkspaceSlack;
    Log(TrainObserver::Level::kInfo,
        "GPU working set from the shape profile of " + planner.shape_profile->measured_at + ": " +
            FormatByteSize(static_cast<uint64_t>(measured)) + " (the static estimate says " +
            FormatByteSize(static_cast<uint64_t>(workspace)) + ")");
    workspace = measured;
  }
  int64_t acts = 0;  // held between forward and backward, per the modes chosen above
  for (int b = 0; b < n; ++b) {
    if (device_plan.modes[b] == engine::SaveMode::kKeep) acts += cost[b].saved_bytes_keep;
    if (device_plan.modes[b] == engine::SaveMode::kRecompute) acts += cost[b].saved_bytes_recompute;
  }
  auto fits = [&](int64_t w) { return w + acts + workspace <= device_plan.gpu_budget; };
  const int64_t streamed = est.streamed;
  using Weights = OffloadPlanConfig::Weights;
  // With the device optimizer placed automatically, weights left to auto are streamed: GPU
  // memory holding a parameter's AdamW states saves 28 B of host memory traffic and its CPU
  // update per step, holding its bf16 weight saves 2 B of PCIe, which the streaming overlaps
  // (Llama-2-7B at 24 GiB on the H200: 2,716 vs 2,310 tok/s at batch 4, 8,652 vs 7,438 at
  // batch 16; bench/RESULTS.md). The device blocks' own weights stay resident.
  // LSP: only the embedding's states can move (PlanLspDeviceOptimizer), so residency comes first
  // (TinyLlama b8 in 6 GiB on the H200: 38,472 tok/s resident, 36,523 streamed with the states
  // then not fitting).
  const bool prefer_states =
      cfg.offload.device_optimizer_blocks == OffloadPlanConfig::kAutoDeviceOptimizer &&
      cfg.offload.device_optimizer_share < 0 && !pipeline.lsp;
  bool resident = cfg.offload.weights == Weights::kResident ||
                  (cfg.offload.weights == Weights::kAuto && !prefer_states);
  if (resident && !fits(weight_bytes) && cfg.offload.weights == Weights::kResident) {
    return ResourceExhaustedError(
        "weights resident on the GPU need " + FormatByteSize(static_cast<uint64_t>(weight_bytes)) +
        " + activations " + FormatByteSize(static_cast<uint64_t>(acts)) + " + workspace " +
        FormatByteSize(static_cast<uint64_t>(workspace)) + " > gpu_memory_limit " +
        FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget)) +
        "; let them stream (offload_param: cpu)" + LargestBatchHint());
  }
  if (!resident || !fits(weight_bytes)) {
    resident = false;
    // Auto layers that do not fit with their checkpoints on the device keep them in pinned host
    // memory instead, lowest first (held longest): each costs its input's bytes over PCIe each way,
    // which the copy streams overlap with the neighbouring blocks' compute.
    int moved = 0;
    for (int b = 1; b + 1 < n && !fits(streamed); ++b) {
      if (cfg.offload.layer_overrides.count(b - 1) ||
          cfg.offload.activations != ActivationMode::kAuto ||
          device_plan.modes[b] != engine::SaveMode::kRecompute ||
          device_plan.offload_checkpoint[b]) {
        continue;
      }
      device_plan.offload_checkpoint[b] = true;
      acts -= cost[b].saved_bytes_recompute;
      ++moved;
    }
    if (moved > 0) {
      Log(TrainObserver::Level::kInfo,
          "the checkpoints of " + std::to_string(moved) +
              " layers wait for the backward in pinned host " +
              "memory (recompute_offload_cpu): with them on the GPU the step needs more than "
              "gpu_memory_limit " +
              FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget)));
    }
    if (!fits(streamed) && !planner.shape_profile) {
      // Smaller MLP tiles and LM-head chunks, the largest whose working sets fit the room the
      // rest of the step leaves at max_seq_length (trainer/tile_plan.h).
      const TileChoice t =
          ChooseTiles(TileShapeAt(cfg.batch_size, SeqLength()),
                      device_plan.gpu_budget - (streamed + acts + workspace - est.tiles));
      if (t.from_budget) {
        workspace += t.bytes() - est.tiles;
        ApplyTiles(t);
        Log(TrainObserver::Level::kInfo,
            "tiles from the GPU budget at " + std::to_string(SeqLength()) +
                " tokens per row: " + t.Describe() + " (the defaults need " +
                FormatByteSize(static_cast<uint64_t>(est.tiles)) + ")");
      }
    }
    if (!fits(streamed)) {
      return ResourceExhaustedError(
          "gpu_memory_limit " + FormatByteSize(static_cast<uint64_t>(device_plan.gpu_budget)) +
          " is too small: even streaming the weights (" +
          FormatByteSize(static_cast<uint64_t>(streamed)) + " in flight) and recomputing " +
          "activations (" + FormatByteSize(static_cast<uint64_t>(acts)) + " held) needs " +
          FormatByteSize(static_cast<uint64_t>(streamed + acts + workspace)) + " with a " +
          FormatByteSize(static_cast<uint64_t>(workspace)) + " workspace" + WorkspaceParts(est) +
          "; lower per_device_train_batch_size or max_seq_length" + LargestBatchHint());
    }
  }
  RETURN_IF_ERROR(
      PlanDeviceOptimizer(resident, (resident ? weight_bytes : streamed) + acts + workspace));
  const int placed = static_cast<int>(
      std::count(device_plan.device_blocks.begin(), device_plan.device_blocks.end(), true));
  planner.planned_held_bytes =
      (resident ? weight_bytes : streamed) + acts + DeviceOptimizerNeeds(resident)[placed];
  ASSIGN_OR_RETURN(int64_t total_mem, pipeline.streams->CapMemory(device_plan.gpu_budget));
  (void)total_mem;
  return resident;
}

Status Trainer::Impl::StartSpill() {
  int spilled = 0;
  uint64_t largest = 0, largest_checkpoint = 0;
  const int64_t B = cfg.batch_size;
  const int64_t T = SeqLength();
  for (int b = 0; b < n; ++b) {
    if (!device_plan.spill_nvme[b] && !device_plan.checkpoint_nvme[b]) continue;
    ++spilled;
    const engine::BlockCost c = model->block(b).EstimateCost(B, T, dtype);
    if (device_plan.spill_nvme[b])
      largest = std::max<uint64_t>(largest, static_cast<uint64_t>(c.saved_bytes_keep));
    if (device_plan.checkpoint_nvme[b]) {
      largest_checkpoint =
          std::max<uint64_t>(largest_checkpoint, static_cast<uint64_t>(c.saved_bytes_recompute));
    }
  }
  if (spilled == 0) return OkStatus();
  if (cfg.offload.nvme_dirs.empty()) {
    return InvalidArgumentError("activations offloaded to NVMe need an NVMe directory (--nvme-dir / nvme_path)");
  }
  ActivationSpillOptions so;
  so.store_binary = cfg.store_binary;
  for (const auto& d : cfg.offload.nvme_dirs) so.dirs.push_back(d + "/activations");
  so.queue_depth = cfg.offload.nvme_queue_depth;
  so.block_size = cfg.offload.nvme_block_size;
  // Four blocks' worth (one being written, two read ahead, one being consumed) with a margin
  // over the estimate, which counts the saved tensors without allocator padding; the host memory
  // check counted the same (trainer/checkpoint_placement.h).
  so.buffer_bytes = ActivationSpillBufferBytes(largest, largest_checkpoint);
  ASSIGN_OR_RETURN(pipeline.spill, ActivationSpill::Create(so, pipeline.streams.get()));
  return OkStatus();
}

Status Trainer::Impl::StartPipeline(bool resident) {
  WeightResidency::Options wo;
  wo.model = model.get();
  wo.layout = &layout;
  wo.host = host.get();
  wo.streams = pipeline.streams.get();
  wo.device = device;
  wo.dtype = dtype;
  wo.resident = resident;
  wo.device_optimizer = pipeline.device_opt.get();
  if (across_hosts()) {
    wo.full_weights = &full_weights;
    wo.wait_weights = [this](int b, uint64_t step) { return gather->WaitGathered(b, step); };
  }
  if (pipeline.lsp &&
      pipeline.lsp->on_device()) {  // effective weights exist only while their block computes
    // W_base + P A Q^T, GPU-timed on its own track (a no-op when block b's are current).
    wo.on_ensured = [l = pipeline.lsp.get(), s = pipeline.streams.get(), m = model.get()](int b) {
      if (!l->Stale(b)) return;
      s->BeginInner("lsp decompress", "decompress " + m->block(b).name());
      l->Materialize(b);
      s->EndInner();
    };
    wo.on_released = [l = pipeline.lsp.get()](int b) { l->Release(b); };
  }
  ASSIGN_OR_RETURN(pipeline.weights, WeightResidency::Create(wo));
  if (across_hosts()) RETURN_IF_ERROR(StartGather());
  std::vector<bool> to_nvme =
      device_plan.spill_nvme;  // whole saved activations, or the layer input
  for (int b = 0; b < n; ++b) to_nvme[b] = to_nvme[b] || device_plan.checkpoint_nvme[b];
  pipeline.activations = std::make_unique<ActivationOffload>(
      pipeline.spill.get(), pipeline.streams.get(), to_nvme, device);

  StepAccounting::Options ao;
  ao.host = host.get();
  ao.streams = pipeline.streams.get();
  ao.spill = pipeline.spill.get();
  ao.scaler = scaler ? &*scaler : nullptr;
  ao.observer = obs;
  ao.trace_steps = cfg.trace_steps;
  ao.max_steps = total;
  pipeline.accounting = std::make_unique<StepAccounting>(ao);

  StepSchedule::Options so;
  so.model = model.get();
  so.layout = &layout;
  so.modes = device_plan.modes;
  so.offload_checkpoint = device_plan.offload_checkpoint;
  so.weights = pipeline.weights.get();
  so.activations = pipeline.activations.get();
  so.host = host.get();
  so.device_optimizer = pipeline.device_opt.get();
  so.streams = pipeline.streams.get();
  so.accounting = pipeline.accounting.get();
  so.scaler = ao.scaler;
  so.device = device;
  so.dtype = dtype;
  so.accumulation_steps = static_cast<uint32_t>(cfg.gradient_accumulation_steps);
  so.dp = dp.get();
  so.ranks_per_host = across_hosts() ? ranks_per_host() : 0;
  if (pipeline.lsp) {
    so.compress = [l = pipeline.lsp.get()](const ParamSlot& slot, const at::Tensor& grad) {
      return l->Compress(slot, grad);
    };
  }
  ASSIGN_OR_RETURN(pipeline.schedule, StepSchedule::Create(so));

  // Updated weights flow back to the device from the optimizer thread, right behind each update.
  if (pipeline.device_opt) pipeline.accounting->SetDeviceParams(pipeline.device_opt->params());
  host->SetOnUpdated([this, w = pipeline.weights.get(), l = pipeline.lsp.get(),
                      h = host.get()](int b) -> Status {
    if (!across_hosts()) w->OnUpdated(b);  // across hosts: once the slices are gathered
    if (!l) return OkStatus();
    const int64_t t0 = NowMicros();  // LSP: W_base + P A Q^T (CPU), or marks the block stale (CUDA)
    RETURN_IF_ERROR(l->OnUpdated(b, h->master_weights(b)));
    if (!l->on_device()) {
      pipeline.accounting->AddSpan({"lsp", "decompress " + model->block(b).name(),
                                    static_cast<double>(t0), static_cast<double>(NowMicros())});
    }
    return OkStatus();
  });
  host->SetSpanSink([this](const char* track, int b, int64_t start_us, int64_t end_us) {
    pipeline.accounting->AddSpan({track, "update " + model->block(b).name(),
                                  static_cast<double>(start_us), static_cast<double>(end_us)});
  });
  return OkStatus();
}

}  // namespace offloadd::trainer
