#pragma once
// Everything the offloaded training pipeline needs to run one job, resolved and validated by the
// caller (the daemon builds it from a JobSpec in job/train_job_config.cc; offloadd-train from
// flags). Torch-free value type.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "job/grad_scaler.h"

namespace offloadd::trainer {

// kRecomputeOffloadCpu: recomputed in backward from its input (the checkpoint), which waits for
// the backward in pinned host memory (DeepSpeed's cpu_checkpointing).
enum class ActivationMode { kAuto, kKeep, kRecompute, kOffloadCpu, kOffloadNvme, kRecomputeOffloadCpu };
enum class StateTier { kCpu, kNvme };  // where fp32 master weights and Adam states live

// One dataset of a mixture (DataConfig::mixture).
struct DataMixtureSource {
  std::vector<std::string> paths;
  double weight = 1;
  std::string format = "auto";
  bool mask_prompt = true;
};

struct DataConfig {
  std::vector<std::string> paths;  // JSON / JSON Lines files
  std::string format = "auto";     // text::ParseDatasetFormat names
  std::string tokenizer_path;      // tokenizer.json or its directory; empty: the model directory
  std::string chat_template;       // "" (tokenizer dir's template, else built-in), "builtin", a file
  bool mask_prompt = true;
  bool packing = false;
  int32_t max_seq_length = 1024;
  bool shuffle = true;
  int64_t max_samples = 0;  // 0: all
  bool skip_bad_records = false;
  // Hold out this fraction of the records (text::HeldOutIndices, by the seed; 0: none): the
  // source is the rest, or with held_out the held-out records themselves (an eval source).
  double eval_split = 0;
  bool held_out = false;
  // Several datasets mixed by weight (text/mixture.h) instead of paths: each is read with its own
  // format and mask_prompt; eval_split and max_samples apply to each. A held-out source is their
  // held-out records one after the other.
  std::vector<DataMixtureSource> mixture;
  std::string stopping_strategy = "first_exhausted";
  // Bench mode: no dataset, uniformly random tokens of exactly this length (seeded).
  int32_t synthetic_seq_length = 0;
  // Unpacked records: pad each micro-batch to one of a few lengths per octave instead of a
  // multiple of 8 (job/batch_planner.h PaddedLength; the loss is the same, the padding has no
  // target). Unset: on a CUDA device, where each new length costs a kernel warm-up in the step.
  std::optional<bool> length_buckets;
};

struct OptimConfig {
  double learning_rate = 5e-5;
  std::string lr_scheduler_type = "linear";
  int64_t warmup_steps = 0;
  double warmup_ratio = 0;
  // transformers' lr_scheduler_kwargs: cosine's number of waves; cosine_with_min_lr's floor as a
  // fraction of learning_rate (trainer/lr_schedule.h).
  double num_cycles = 0.5;
  double min_lr_rate = 0;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double max_grad_norm = 1.0;  // <= 0: no clipping
  // With clipping: update each block as its gradients land, assuming no clipping, and correct
  // those updates when the step does clip (workers/step_driver.h). "auto" speculates while fewer
  // than half of the recent steps clipped; "always" / "never". Not with fp16 loss scaling or the
  // NVMe tier (then never). "" (unset): "auto" on a CUDA device, "never" on the CPU
  // (Trainer resolves it and the plan log names it). With speculation, in a step that clips, which
  // blocks were speculated depends on timing, and a corrected update differs from a held one in
  // the last bits: runs are reproducible within fp32 rounding (the PyTorch parity bounds of
  // tests/python/trainer/test_speculation.py), not bit for bit; "never" is the bitwise choice.
  // On the CPU the backward and the updates share the cores, so speculation has little to
  // overlap, and CPU runs stay bitwise by default (bench/RESULTS.md, "The speculation default").
  std::string speculation;
  // The compact optimizer modes (docs/optimizer-modes.md): "fp32" (exact, the default), "bf16" or
  // "int8" states; the master stays fp32 ("bf16" is refused until the trainer runs it). Compact
  // states live in the host arena only (no device kernels for them yet) and never speculate.
  std::string state_dtype = "fp32";
  std::string master_dtype = "fp32";
};

struct OffloadPlanConfig {
  StateTier tier = StateTier::kCpu;
  // Tier kNvme: the optimizer store's directories; activations offloaded to NVMe use an
  // `activations` directory inside each.
  std::vector<std::string> nvme_dirs;
  uint32_t nvme_queue_depth = 32;
  uint32_t nvme_block_size = 0;  // the store's --block-size (aio.block_size); 0: its default, 1 MiB
  ActivationMode activations = ActivationMode::kAuto;
  std::map<int, ActivationMode> layer_overrides;  // decoder layer index -> mode
  // Device weights: kAuto keeps them resident when they fit the budget, else streams them in a
  // few blocks ahead of use (DeepSpeed's offload_param: cpu forces kStreamed).
  enum class Weights { kAuto, kResident, kStreamed } weights = Weights::kAuto;
  // Tier kNvme, 16-bit compute: where the 16-bit weights of blocks whose states are on NVMe live
  // (DeepSpeed's offload_param.device). kCpu: in RAM; kAuto: in the store only where the states
  // on NVMe leave the job above the host limit (job/state_placement.h); kNvme: in the store
  // for every such block. The trainer reads them back ahead of each pass (WeightResidency).
  enum class ParamTier { kCpu, kAuto, kNvme } param_tier = ParamTier::kCpu;
  uint64_t gpu_memory_limit = 0;   // bytes; 0: what the device has free
  uint64_t host_memory_limit = 0;  // bytes; 0: no limit
  // 16-bit compute, RAM tier: keep a 16-bit copy of the weights beside the fp32 masters in the
  // arena (16 bytes per parameter). false (default): the device reads the fp32 masters and
  // rounds them itself, to the same bits (14 bytes per parameter; HostOptimizerOptions).
  bool host_weight_copy = false;
  // >= 0: LSP-Offload's static schedule: decoder layers < transition have their CPU updates
  // deferred to the end of backward and run in ascending order, the others first-come-first-
  // served. -1: earliest-needed-first dispatch (workers/step_driver.h, "Update order").
  int transition_layer = -1;
  // Updates queued per worker process ahead of the one running (earliest-needed-first dispatch
  // picks from what is not queued yet: fewer queued, sooner a layer the next forward needs first
  // overtakes the others; more, fewer idle gaps between commands). 1 measured 4% faster than 2
  // at Llama-2-7B batch 16 on the H200 machine (bench/RESULTS.md).
  uint32_t update_depth = 1;
  // Blocks whose fp32 master weights and Adam states live on the device and are updated there
  // (trainer/pipeline/device_optimizer.h), counted from the embedding up: the next forward needs
  // those first, and their gradients come last in backward. kAutoDeviceOptimizer: as many as fit
  // the GPU budget left beside the first step's measured peak (then weights left to kAuto are
  // streamed); on a CPU device only within an explicit gpu_memory_limit, else none.
  static constexpr int kAutoDeviceOptimizer = -1;
  int device_optimizer_blocks = kAutoDeviceOptimizer;
  // >= 0 (overrides device_optimizer_blocks): the smallest number of lowest blocks holding at
  // least this share of the parameters (DeepSpeed's offload_optimizer.ratio is 1 - share).
  double device_optimizer_share = -1;
};

// LSP-Offload (lsp/README.md): every 2-D weight of a decoder layer is trained in an
// s x s subspace of learned d-sparse projectors, W = W_base + P A Q^T; the CPU's AdamW runs on A.
struct LspConfig {
  bool enabled = false;
  int64_t rank = 512;        // s, clamped per side to the matrix
  int64_t nonzeros = 16;     // d, clamped to s
  // Steps between projector checks (the first step always checks): the seed's 1000. A check costs
  // 20-33 s at 1.1B-7B on the H200 (bench/RESULTS.md), 0.03 s per step amortised over 1000.
  int64_t check_every = 1000;
  double threshold = 0.5;    // relative squared bias that triggers learning new projectors
  int learn_steps = 50;      // Adam steps of the projector learning
  double learn_lr = 1e-2;
  double gamma = 1e-4;       // the learning's norm regulariser
  bool identity = false;     // identity projectors (s = the full dimensions, no checks): tests
};

// Data parallelism over the GPUs of one host (docs/data_parallel.md): world_size
// executor processes, one per device, each computing on its rows of every global micro-batch.
// Per block, the gradients are reduce-scattered over the group (c10d: NCCL on CUDA, Gloo on the
// CPU); each rank copies its shard into the one shared arena, whose workers update the block once
// (rank 0 owns the arena, the workers, the step's decisions and the checkpoints; the others attach
// to its arena). Every rank uploads the updated weights from that arena.
struct ParallelConfig {
  int world_size = 1;
  int rank = 0;
  // Where the group meets: "file:///dir/rendezvous" (one host) or "tcp://host:port" (rank 0
  // listens there). Required when world_size > 1.
  std::string rendezvous;
  int64_t timeout_seconds = 600;  // rendezvous and collectives
  // Hosts the ranks span (torchrun's GROUP_WORLD_SIZE). > 1: ZeRO-1 across hosts, world_size /
  // hosts ranks per host, numbered host by host: each host's arena (shared by its ranks) holds
  // the optimizer states of a contiguous 1/hosts slice of every block (docs/data_parallel.md,
  // "Across hosts").
  int hosts = 1;
};

struct TrainConfig {
  std::string model_dir;
  bool random_init = false;  // bench: config.json only, transformers-style random weights
  // The engine applies no dropout: a model whose config.json sets some is refused unless this
  // is set (job `dropout: disable`, offloadd-train --dropout=disable); then training logs that it
  // runs without dropout.
  bool dropout_disabled = false;
  std::string device = "cpu";          // "cpu", "cuda", "cuda:N"
  std::string compute_dtype = "auto";  // auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16
  LossScaleConfig loss_scale;          // fp16 only: dynamic loss scaling (torch.amp.GradScaler)
  DataConfig data;
  // Held-out records (eval_data.paths or eval_data.mixture non-empty): their mean token loss
  // before training, every eval_steps steps and at the end (HF eval_strategy "steps"). Read in
  // order, never shuffled.
  DataConfig eval_data;
  int64_t eval_steps = 0;
  OptimConfig optim;
  OffloadPlanConfig offload;
  LspConfig lsp;
  ParallelConfig parallel;
  // Sequences per micro-batch on each rank (auto_batch_size: the largest one tried); the global
  // micro-batch is batch_size x parallel.world_size.
  int32_t batch_size = 8;
  int32_t gradient_accumulation_steps = 1;
  // per_device_train_batch_size: auto (job/batch_planner.h): the micro-batch and accumulation
  // the step planner prices fastest, set before anything is sized by them. global_batch_size > 0
  // (train_batch_size): micro x accumulation equals it; else the accumulation stays as given.
  bool auto_batch_size = false;
  int32_t global_batch_size = 0;
  double num_train_epochs = 3;
  int64_t max_steps = -1;  // > 0 overrides num_train_epochs
  uint64_t seed = 42;
  int64_t logging_steps = 1;
  int64_t save_steps = 0;  // 0: only the final model
  int64_t save_total_limit = 0;
  std::string output_dir;   // checkpoints and the exported model; empty: nothing written
  bool export_final_model = true;
  std::string resume_from;  // a checkpoint directory to continue from
  // Processes and binaries beside the trainer.
  std::string worker_binary;  // offloadd-worker
  std::string store_binary;   // offloadd-store (tier kNvme)
  uint32_t worker_processes = 1;
  uint32_t worker_threads = 0;  // per process; 0: the cores this process may use
  // Threads for the set-up's bulk work before the first step: populating the arena, reading the
  // initial weights into it, page-locking the copy buffers. 0: the cores this process may use;
  // 1: one thread (what every set-up did before).
  uint32_t setup_threads = 0;
  // With more than one set-up thread and the RAM tier: populate the arena in the background,
  // each block's masters first, and fill block b as soon as its pages are in (the workers and the
  // device set-up also run beside it). False: populate all of it, then read (what set-ups did
  // before; the same masters bit for bit).
  bool setup_overlap = true;
  // Stop after the plan (model, data, batch size, device plan; no arena, no step): the trainer
  // prices the job's step (Trainer::prediction()), as offloadd-train --validate-only prints it.
  bool validate_only = false;
  // CPU AdamW kernel flavour: auto (OFFLOADD_ADAMW_KERNEL, else the fastest), portable, avx2,
  // avx512, avx512bf16. Every flavour computes the same AdamW (workers/adamw_kernel.h).
  std::string adamw_kernel = "auto";
  // Where the node profile (trainer/plan/node_profile.h) is cached; empty: measured every run. The
  // daemon passes <state_dir>/profiles.
  std::string profile_dir;
  std::string trace_path;       // Chrome trace JSON, written at the end (and every 10 steps)
  int64_t trace_steps = 3;      // steps recorded in the trace (0: all)
};

}  // namespace offloadd::trainer
