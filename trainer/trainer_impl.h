#pragma once
// Trainer internals shared by trainer.cc (step loop), trainer_setup.cc (plan, arena, the step's
// owners) and trainer_state.cc (checkpoints, export). Not a public header.
//
// Impl holds the job-wide pieces (config, model and layout, data, the host optimizer, the
// data-parallel group, the step counters) and groups the rest by owner: `pipeline` (the step's
// parts on the device side: streams, weight residency, activation offload, schedule, accounting,
// the device optimizer; trainer/pipeline/step_pipeline.h), `device_plan` and `planner` (what the
// device plan decided and what its planning measured; trainer/plan/device_planner.h), `eval` (the
// held-out evaluation) and `setup_timing` (trainer/setup_timing.h).

#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/model.h"
#include "job/batch_planner.h"
#include "job/grad_scaler.h"
#include "job/host_memory.h"
#include "job/shape_profile.h"
#include "job/step_planner.h"
#include "job/tile_plan.h"
#include "trainer/data_source.h"
#include "trainer/lr_schedule.h"
#include "trainer/pipeline/block_layout.h"
#include "trainer/pipeline/data_parallel.h"
#include "trainer/pipeline/group_link.h"
#include "trainer/pipeline/host_gather.h"
#include "trainer/pipeline/host_optimizer.h"
#include "trainer/pipeline/step_pipeline.h"
#include "trainer/plan/device_planner.h"
#include "trainer/plan/node_profile.h"
#include "trainer/setup_timing.h"
#include "trainer/trainer.h"

namespace offloadd::trainer {

class CheckpointReader;
struct TrainerState;

// Waits for the current CUDA stream (a no-op on the CPU): the planner's timings (trainer_batch.cc).
void Synchronize(bool cuda);

// Room above a profiled working set: the caching allocator's placement, and so its reserved
// peak, differs slightly between runs of the same step (a few 20 MiB expandable-segment pages
// per block); a margin of 256 MiB is 4% of the smallest (6 GiB) budget the benchmarks use.
inline constexpr int64_t kProfiledWorkspaceSlack = int64_t{256} << 20;
// Kept activations are priced at 1.5x the engine's estimate: the estimate counts the saved
// tensors without allocator rounding or the backward's larger transients (the reason recompute
// is the default on CUDA), and an out-of-memory error mid-job costs more than a recompute.
inline constexpr double kKeepSafety = 1.5;
// Measured kept bytes (the shape profile) still round up to the allocator's blocks and pages.
inline constexpr double kMeasuredKeepSafety = 1.1;

// The held-out evaluation (cfg.eval_data): its records, rewound to `start` for each evaluation,
// the step of the last evaluation and its mean token loss (the model card's eval loss).
struct HeldOutEval {
  std::unique_ptr<DataSource> data;  // null without cfg.eval_data
  std::string start;                 // data's state before its first record
  int64_t at_step = -1;
  std::optional<double> loss;
};

struct Trainer::Impl {
  TrainConfig cfg;
  TrainObserver* obs = nullptr;
  // Data parallel (cfg.parallel.world_size > 1): the process group and the shared control segment
  // (declared before `host`, which uses them, so that they outlive it). Rank 0 (the leader) owns
  // the arena, the updates, checkpoints, evaluation and export.
  std::unique_ptr<DataParallel> dp;
  std::unique_ptr<GroupLink> link;
  bool leader() const { return dp == nullptr || dp->rank() == 0; }
  int world() const { return dp == nullptr ? 1 : dp->world(); }
  std::unique_ptr<engine::Model> model;
  std::unique_ptr<DataSource> data;
  HeldOutEval eval;  // cfg.eval_data
  std::unique_ptr<HostOptimizer> host;
  std::optional<LrSchedule> lr_schedule;
  std::optional<GradScaler> scaler;  // fp16 compute only
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::kFloat;
  bool cuda = false;
  int n = 0;  // blocks
  std::vector<BlockLayout> layout;
  // The step's owners on the device side (trainer/pipeline/step_pipeline.h): streams, residency,
  // activation offload and spill, schedule, accounting, the device optimizer, LSP mode.
  StepPipeline pipeline;
  int64_t steps_run = 0;               // by this process (a resumed run counts from its checkpoint)
  bool speculation_defaulted = false;  // cfg.optim.speculation was unset (train_config.h)
  workers::OptimizerMode optimizer_mode;  // cfg.optim.state_dtype / master_dtype
  // What the device plan decided (per block activations, states on the GPU or NVMe, tiles, the
  // GPU budget) and what its planning steps measured and remember (trainer/plan/device_planner.h).
  DevicePlan device_plan;
  DevicePlanner planner;
  // Set-up timing by phase, from Trainer::Create (trainer/setup_timing.h).
  SetupTiming setup_timing;

  int64_t completed = 0;  // optimizer steps whose updates were submitted
  int64_t total = 0;

  // trainer_setup.cc
  Status Setup();
  Status CheckConfig();  // device, compute dtype, numbers
  Status CheckOptimizerMode();  // trainer_state.cc: the compact modes the trainer runs
  Status CheckParamTier() const;  // offload_param on NVMe: refused where it cannot act
  Status CreateData();   // the training and eval data, total steps, the LR schedule
  uint32_t SetupThreads() const;  // cfg.setup_threads, else the usable cores
  Status PinHostBuffers();  // page-locks the host buffers the pipeline copies, on SetupThreads()
  // trainer_parallel.cc: joins the data-parallel group (refusing what it does not support yet);
  // creates (rank 0) or attaches to (others) the host optimizer; the stop decision between steps.
  Status StartGroup();
  Status CreateHostOptimizer(HostOptimizerOptions ho);
  StatusOr<bool> StopAtBoundary();
  // trainer_hosts.cc, ZeRO-1 across hosts (cfg.parallel.hosts > 1; ranks numbered host by
  // host, world / hosts per host): host h's arena, shared by its ranks as on one host (its local
  // rank 0 leads, the others follow through `link`), holds the optimizer states of
  // [SliceBegin(b), + SliceLength(b)) of every block b: the reduce-scatter's shards of its ranks,
  // contiguous. `full_weights` holds every block's whole weights in the host's dtype, on every
  // rank, all-gathered from the ranks' shards of the updated slices block by block (HostGather).
  bool across_hosts() const { return dp != nullptr && cfg.parallel.hosts > 1; }
  int ranks_per_host() const { return across_hosts() ? dp->world() / cfg.parallel.hosts : world(); }
  int host_index() const { return dp == nullptr ? 0 : dp->rank() / ranks_per_host(); }
  int local_rank() const { return dp == nullptr ? 0 : dp->rank() % ranks_per_host(); }
  bool host_leader() const { return local_rank() == 0; }  // drives its host's arena
  std::vector<at::Tensor> full_weights;
  int64_t SliceBegin(int b) const;
  int64_t SliceLength(int b) const;
  int64_t ShardBegin(int b) const;  // this rank's reduce-scatter shard of block b (clipped)
  int64_t ShardLength(int b) const;
  Status CheckAcrossHosts(const std::string& what);  // StartGroup: what is not built is refused
  HostOptimizerOptions SliceOptions(HostOptimizerOptions ho);
  // Set-up: `fill` (the whole blocks' initial values, in pieces) into this host's slice of the
  // masters and into full_weights.
  Status InitializeAcrossHosts(
      const std::vector<HostOptimizer::InitPiece>& pieces,
      const std::function<Status(const HostOptimizer::InitPiece&, float*)>& fill);
  // The gather thread (StartPipeline): after step k (RunStep's gather->Submit(k)) every block's
  // slices are all-gathered, each once this host's update of it is done, in block order on every
  // rank; the next forward of block b waits for block b's gather only (WeightResidency's
  // wait_weights). GatherBlock: one block, straight into the resident device weights on CUDA,
  // else into full_weights. WaitGathers: every block of the last step (before the weights are
  // read outside a step, or the slices rewritten).
  std::unique_ptr<HostGather> gather;
  Status StartGather();
  Status GatherBlock(int b);
  Status WaitGathers();
  // The export: every block's whole fp32 masters, on every rank (a collective).
  StatusOr<std::vector<at::Tensor>> GatherMasters();
  // Checkpoints across hosts. Every host's leader writes its partition, its slice of every
  // layer's states, as a checkpoint of its own in PartitionDir() (output_dir/partition-<h>-of-<H>);
  // hosts > 0 commit theirs and tell rank 0 (PublishPartition), which waits until every other
  // partition is committed (AwaitPartitions) before it commits partition 0: that commit is the
  // checkpoint's. RestorePartition restores this host's partition of the checkpoint whose
  // partition 0 is `dir` (a missing or foreign one is refused, naming it; the host's other ranks
  // take the step and data position from it), and gathers the whole weights.
  std::string PartitionDir(int host) const;
  std::string PartitionFingerprint(int host) const;
  Status PublishPartition(int64_t step, const std::string& committed);
  Status AwaitPartitions(int64_t step);
  Status RestorePartition(const std::string& dir);
  Status ResumeHostFollower(const CheckpointReader& r, const std::string& mine);
  Status ResumeAcross(const TrainerState& st, int64_t adam_steps, const std::string& mine);
  Status RestoreFollower(const std::string& dir);
  Status LoadModel();    // placeholders and the block layout
  // Activation modes and weight residency under the GPU budget; returns whether the weights
  // stay resident on the device.
  StatusOr<bool> PlanDevice();
  // How many of the lowest blocks get device-resident optimizer states, given the device
  // memory the rest of the plan uses (`used`); fills device_plan.device_blocks.
  Status PlanDeviceOptimizer(bool resident, int64_t used);
  Status PlanLspDeviceOptimizer(bool resident, int64_t used);  // its LSP case: the exact lowest blocks
  // Creates the DeviceOptimizer with the arena's initial masters (after host->Initialize).
  Status StartDeviceOptimizer();
  // trainer_plan.cc. auto: after the first step, the step planner picks how many of the lowest
  // blocks move their AdamW states from the arena to the device and how many top layers keep
  // their activations, from the node profile and the first step's measurements.
  Status PlaceDeviceBlocks();
  // The top `keep` recomputed decoder layers keep their activations from the next step on.
  Status ApplyKeptLayers(int keep);
  // The lowest `count` blocks' AdamW states move from the arena to the device, between steps.
  Status MoveStatesToDevice(int count);
  // Data parallel: rank 0 publishes its plan (device blocks, kept layers); the other ranks apply
  // it (trainer_parallel.cc). Every GPU then holds replicas of the same blocks' states, updated
  // from the all-reduced gradients, and keeps the same layers' activations.
  Status PublishDevicePlan(int device_block_count);
  Status FollowDevicePlan();
  // Once the checked step is reported: measured against predicted, re-solved once if > 10% off.
  Status CheckPlan();
  // Records of varying length (not FixedShape): GPU time priced at the data's expected padded
  // length with the blocks timed there, instead of the measured step's (trainer_plan.cc); sets
  // planner.planned_flops, the per-step model FLOPs at that length (0: priced on the measured
  // step).
  Status PriceVariableLengths(PlanInputs* in);
  // trainer_plan.cc: warms the likely padded lengths (length buckets); what it did, for the log.
  std::string WarmLengths(const std::vector<std::pair<int64_t, double>>& lengths);
  // trainer_profile.cc: the shape profile's key, the cached one (nullopt: none usable, and why
  // in the log), and recording the step just run (then writing it under cfg.profile_dir).
  std::string ShapeKey(int64_t batch) const;
  int64_t SeqLength() const;  // the micro-batch's tokens per row (synthetic or max_seq_length)
  // Every micro-batch has SeqLength() tokens per row (synthetic data, or packing). Otherwise rows
  // are padded to each batch's longest record, so a measured step may be shorter than the longest
  // the job will run: its memory and times are not used as the job's (shape profiles are neither
  // recorded nor read, and the planner takes the static estimate at SeqLength() as its floor).
  bool FixedShape() const;
  std::optional<ShapeProfile> CachedShapeProfile(int64_t batch);
  Status RecordShapeProfile();
  // Device memory the AdamW states of blocks [0, k) need, per k (their weights replace resident
  // copies).
  // accumulation 0: the job's.
  std::vector<int64_t> DeviceOptimizerNeeds(bool resident, int accumulation = 0) const;
  // trainer_batch.cc. The activation modes the spec asks for, before any measurement (auto:
  // recompute on CUDA, keep on the CPU device); fills device_plan's modes, spill_nvme and
  // offload_checkpoint.
  Status InitialModes();
  // The static estimate of the step's GPU memory at micro-batch B (PlanDevice's and the
  // automatic batch size's): the blocks' costs, all weights, the streaming window, the workspace.
  struct MemoryEstimate {
    std::vector<engine::BlockCost> cost;
    int64_t weights = 0, streamed = 0, workspace = 0;
    // Of the workspace: packed batches' attention, LSP's working set (working_set.h), the MLP
    // tile's or the head chunk's (trainer/tile_plan.h, at `tiles`).
    int64_t packed_attention = 0, lsp = 0, tiles = 0;
  };
  // The tiled MLP's and the LM head's shape at B x T.
  TileShape TileShapeAt(int64_t B, int64_t T) const;
  // Sets `t` in the engine (parts::SetMlpTileBytes, SetHeadChunkBytes) and in device_plan.tiles.
  void ApplyTiles(const TileChoice& t);
  // Packed records (not synthetic): attention within documents (engine/doc_attention.h).
  bool Packed() const { return cfg.data.packing && cfg.data.synthetic_seq_length <= 0; }
  // The largest micro-batch up to `cap` whose static estimate fits the GPU budget with the
  // weights streamed and the checkpoints in pinned RAM where they may go (what PlanDevice falls
  // back to); 0 when not even 1 does. Names the batch a refusal suggests.
  int LargestFittingMicroBatch(int cap) const;
  // Whether micro-batch `micro` of `seq` tokens per row fits so (LargestFittingMicroBatch's test),
  // and the largest max_seq_length (a multiple of 8, at most `cap`) at which `micro` does.
  bool FitsStreamed(int micro, int64_t seq) const;
  int64_t LargestFittingSeqLength(int micro, int64_t cap) const;
  std::string LargestBatchHint() const;
  std::string WorkspaceParts(const MemoryEstimate& est) const;  // " (of it packed attention ...)"  // "; the largest micro-batch that fits is N (...)"
  MemoryEstimate EstimateMemory(int64_t B, int64_t seq = 0) const;  // seq 0: SeqLength()
  int64_t DeviceBudget() const;  // gpu_memory_limit, else 90% of what the device has free
  // The node profile (cached under cfg.profile_dir, else measured once per run), logged.
  StatusOr<NodeProfile> PlanNodeProfile();
  // per_device_train_batch_size auto (job/batch_planner.h): sets cfg.batch_size and
  // cfg.gradient_accumulation_steps before anything is sized by them.
  Status ChooseBatchSize();
  // seq: tokens per row priced (0: SeqLength()); `basis` (may be null) gets where the GPU work's
  // figures came from; memory_seq: the row length the GPU memory is sized for (0: SeqLength(), the
  // longest row a job of records of varying length may meet).
  // `moe` (may be null) gets a mixture of experts' figures at this micro-batch
  // (job/moe_pricing.h).
  StatusOr<BatchCandidate> PriceBatch(int micro, int accumulation, const NodeProfile& prof,
                                      int64_t seq = 0, std::string* basis = nullptr,
                                      int64_t memory_seq = 0, MoeStepFigures* moe = nullptr);
  // The configured step at other row lengths (PredictStep): powers of two from 1024 (less for a
  // model of fewer than 4096 positions) up to its max_position_embeddings, and max_seq_length.
  Status PredictLengths(const NodeProfile& prof);
  // TrainConfig::validate_only: prices the configured step into `prediction` (trainer_batch.cc).
  Status PredictStep();
  StepPrediction prediction;
  // The host RAM and disk the planned job needs (job/host_memory.h) against
  // cfg.offload.host_memory_limit, which it resolves (unset: DefaultHostMemoryLimit, as the
  // daemon); RESOURCE_EXHAUSTED with the numbers and the smallest change that fits, before the
  // arena is made (trainer_plan.cc). Fills prediction's host fields.
  Status CheckHostMemory();
  // In CheckHostMemory, after the optimizer states' placement: the fewest lowest offloaded layer
  // inputs go to NVMe that bring `in` under `limit` (trainer/checkpoint_placement.h), priced
  // at the node profile's store rates against the step's compute; refused naming the bytes when
  // the store directories' `disk_free` cannot hold them. Fills device_plan.checkpoint_nvme.
  Status PlaceLayerInputs(HostMemoryInputs* in, uint64_t limit, uint64_t disk_free);
  // The step planner's share of them: the NVMe layer inputs' bytes per step at `micro` x `seq`,
  // at the store's rates.
  void AddNvmeLayerInputs(PlanInputs* in, int micro, int64_t seq, const NodeProfile& prof) const;
  double SecondsPerFlop(int64_t micro);  // a GEMM of the model's MLP shape at micro x seq rows
  // A mixture of experts: the experts' GEMMs run one per non-empty expert over tokens x top_k /
  // min(E, tokens x top_k) rows each (MoeStepFigures::expert_rows), far fewer than the dense
  // GEMM's; their flops are priced at the rate of one expert's gate projection at those rows,
  // measured over as many experts as are routed (up to 16). 0 for a dense model.
  double ExpertSecondsPerFlop(int64_t micro, int64_t seq);
  // One sparse layer's expert flops per micro-batch of [micro, seq] (forward; 0 when dense).
  double LayerExpertFlops(int b, int64_t micro, int64_t seq) const;
  // CUDA: the embedding, one decoder layer and the head run at [micro, seq] with random weights
  // (the model's placeholders are put back after), timed warm (trainer_batch.cc).
  struct BlockTiming {
    double embedding_s = 0;  // forward + backward
    double layer_forward_s = 0;
    double layer_backward_s = 0;  // the recompute included (the layer ran kRecompute)
    double head_s = 0;            // forward (with the head's backward inside) + backward
    // The first run at this shape over the warm ones (cuDNN builds its attention graphs per
    // sequence length; the allocator grows): what a step at a new length adds, forward and
    // backward.
    double new_shape_forward_s = 0, new_shape_backward_s = 0;
    // A mixture of experts with dense layers too (mlp_only_layers, decoder_sparse_step): layer_*
    // are a sparse layer's times, dense_* a dense layer's; `mixed` false when all are alike.
    bool mixed = false;
    double dense_forward_s = 0, dense_backward_s = 0;
    double Forward(bool sparse) const {
      return mixed && !sparse ? dense_forward_s : layer_forward_s;
    }
    double Backward(bool sparse) const {
      return mixed && !sparse ? dense_backward_s : layer_backward_s;
    }
  };
  // Whether block b is a sparse decoder layer (a mixture of experts).
  bool SparseBlock(int b) const;
  // reps 1: only the warm-up run (the kernels of that shape are then warm; its times are 0).
  StatusOr<BlockTiming> TimeBlocks(int64_t micro, int64_t seq, int reps = 3);
  // PriceBatch's parts. At micro-batch `micro` of `mem_T` tokens per row: where the activations
  // wait and whether the weights stay resident, as PlanDevice decides them, and the GPU memory
  // that holds (why_not when it does not fit).
  struct BatchMemory {
    MemoryEstimate est;
    std::vector<bool> offloaded;  // per block: its checkpoint waits in pinned RAM
    int64_t offloaded_bytes = 0;
    bool resident = false;
    int64_t held = 0;  // weights, activations and workspace on the GPU (0 on the CPU device)
    TileChoice tiles;  // the tiles it fits with (smaller than device_plan.tiles when those do not)
    std::string why_not;
  };
  BatchMemory FitBatchMemory(int micro, int64_t mem_T, const std::optional<ShapeProfile>& profiled,
                             bool auto_states) const;
  // One micro-batch's GPU seconds from the shape profile, else the timed blocks, else the flop
  // counts at `spf` seconds per flop; fills the step planner's per-block inputs in `in`.
  struct BlockSeconds {
    double gpu = 0, forward = 0, head_forward = 0;
  };
  // expert_spf > 0: a sparse layer's expert flops (LayerExpertFlops at `expert_shape`, the
  // micro-batch and the row length of the blocks' estimates) at that rate instead.
  BlockSeconds PriceBlocks(const BatchMemory& mem, const std::optional<ShapeProfile>& profiled,
                           const std::optional<BlockTiming>& timed, double spf, bool may_keep,
                           int accumulation, PlanInputs* in, double expert_spf = 0,
                           std::pair<int64_t, int64_t> expert_shape = {0, 0}) const;
  // Logs the timed blocks beside what the flop count at the GEMM rate said.
  void LogBlockTiming(int micro, int64_t T, double gpu, const BlockTiming& timed,
                      const MemoryEstimate& est, double flop_rate_s);
  // Held updates' tails (step_planner.h) from the copy rates already in `in` and one
  // micro-batch's head forward.
  void SetHeldTails(PlanInputs* in, double head_forward_s) const;
  // The per-parameter traffic of this job's arena (ApplyParamTraffic) and its NVMe blocks' disk
  // term at the node profile's store rates; `streamed`: weights upload per micro-batch.
  void SetParamTraffic(PlanInputs* in, bool streamed, const NodeProfile& prof) const;
  Status StartSpill();
  HostOptimizerOptions HostOptions() const;
  // The step's owners, once the host optimizer's arena holds the initial weights.
  Status StartPipeline(bool resident);
  std::string DescribePlan(const HostOptimizerOptions& ho) const;
  // Clipping and the speculation policy in force (its default resolved in CheckConfig).
  std::string DescribeClipping(const HostOptimizerOptions& ho) const;
  // trainer.cc
  Status RunStep();
  // Step k's learning rate and loss scale, once step k-1 is reported; starts its updates.
  Status BeginUpdates(int64_t k);
  Status Flush();
  // The held-out loss at the current step (after its updates), reported to the observer.
  Status Evaluate();
  // LSP mode: the projector check of step k on the probe micro-batch `mb`, between steps.
  Status CheckProjectors(int64_t k, engine::MicroBatch& mb);
  // Held device updates (clipping, fp16): once step k's outcome is known, the device blocks are
  // updated with its coefficient on the compute stream, ahead of the next forward.
  Status UpdateDeviceBlocks(int64_t k);
  // Block b's fp32 states, wherever they live.
  Status ReadBlockStates(int b, float* master, float* exp_avg, float* exp_avg_sq);
  Status RestoreBlockStates(int b, const float* master, const float* exp_avg,
                            const float* exp_avg_sq, uint64_t adam_step);
  // trainer_state.cc
  StatusOr<std::string> SaveCheckpoint();
  Status RestoreCheckpoint(const std::string& dir);
  Status ExportTokenizer(const std::string& dir);  // tokenizer files and the chat template used
  // What a checkpoint holds of the tokenizer, by file name: the files ExportTokenizer writes (the
  // model directory's, a separate tokenizer's over them, the chat template training used), so
  // that apply_chat_template works on every checkpoint-N/ as on the final model.
  StatusOr<std::vector<std::pair<std::string, std::string>>> TokenizerFiles();
  Status WriteModelCard(const std::string& dir);  // README.md, as Hugging Face's Trainer writes
  Status ExportModel(const std::string& dir);
  std::string Fingerprint() const;
  void Log(TrainObserver::Level level, const std::string& message);
};

}  // namespace offloadd::trainer
