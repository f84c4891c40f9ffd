#include "job/train_job_config.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/units.h"
#include "job/latest_checkpoint.h"
#include "job/unsupported_options.h"
#include "jobspec/job_defaults.h"
#include "trainer/state/checkpoint.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
using trainer::ActivationMode;

const char* FormatName(v1::DatasetFormat f) {  // text::ParseDatasetFormat's names
  switch (f) {
    case v1::DATASET_FORMAT_ALPACA: return "alpaca";
    case v1::DATASET_FORMAT_SHAREGPT: return "sharegpt";
    case v1::DATASET_FORMAT_TEXT: return "text";
    case v1::DATASET_FORMAT_MESSAGES: return "messages";
    case v1::DATASET_FORMAT_PROMPT_COMPLETION: return "prompt_completion";
    case v1::DATASET_FORMAT_PRETOKENIZED: return "pretokenized";
    default: return "auto";
  }
}

StatusOr<ActivationMode> ToActivationMode(v1::ActivationMode m, const std::string& field) {
  switch (m) {
    case v1::ACTIVATION_MODE_UNSPECIFIED:
    case v1::ACTIVATION_MODE_AUTO: return ActivationMode::kAuto;
    case v1::ACTIVATION_MODE_KEEP: return ActivationMode::kKeep;
    case v1::ACTIVATION_MODE_RECOMPUTE: return ActivationMode::kRecompute;
    case v1::ACTIVATION_MODE_OFFLOAD_CPU: return ActivationMode::kOffloadCpu;
    case v1::ACTIVATION_MODE_OFFLOAD_NVME: return ActivationMode::kOffloadNvme;
    case v1::ACTIVATION_MODE_RECOMPUTE_OFFLOAD_CPU: return ActivationMode::kRecomputeOffloadCpu;
    default: return InvalidArgumentError(field + ": unsupported activation mode " + v1::ActivationMode_Name(m));
  }
}

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  const std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

// offload: where the optimizer states, weights and activations live, the NVMe directories (one
// per job in each root) and the store's aio settings.
Status ApplyOffload(const v1::JobSpec& s, const std::string& job_id, const TrainerEnvironment& env,
                    trainer::TrainConfig& c) {
  const v1::OffloadConfig& o = s.offload();
  // Optimizer states on the GPU: none (all of them) or a ratio kept on the host (ZeRO-Offload++);
  // unset, placed after the first step where they fit (set with the device above).
  if (o.offload_optimizer().device() == v1::OFFLOAD_DEVICE_NONE) {
    c.offload.device_optimizer_share = 1.0;
  } else if (o.offload_optimizer().has_ratio()) {
    c.offload.device_optimizer_share = 1.0 - o.offload_optimizer().ratio();
  }
  // The store directories serve optimizer states on NVMe and activations offloaded to NVMe.
  bool nvme_activations = o.activations().mode() == v1::ACTIVATION_MODE_OFFLOAD_NVME;
  for (const auto& [layer, mode] : o.activations().layer_overrides()) {
    nvme_activations |= mode == v1::ACTIVATION_MODE_OFFLOAD_NVME;
  }
  const bool nvme_states = o.offload_optimizer().device() == v1::OFFLOAD_DEVICE_NVME;
  if (nvme_states) c.offload.tier = trainer::StateTier::kNvme;
  if (nvme_states || nvme_activations) {
    std::vector<std::string> roots;
    if (!o.offload_optimizer().nvme_path().empty()) {
      roots.push_back(o.offload_optimizer().nvme_path());
    } else {
      roots.assign(env.store_dirs().begin(), env.store_dirs().end());
    }
    if (roots.empty()) {
      return FailedPreconditionError(std::string(nvme_states
                                                     ? "offload.offload_optimizer.device: nvme"
                                                     : "offload.activations: offload_nvme") +
                                     " needs a store directory; none is configured "
                                     "(storage.directories or offload_optimizer.nvme_path)");
    }
    for (const auto& r : roots) c.offload.nvme_dirs.push_back(r + "/" + job_id);
  }
  if (o.aio().queue_depth() > 0) c.offload.nvme_queue_depth = o.aio().queue_depth();
  if (o.aio().block_size() > 0)
    c.offload.nvme_block_size = static_cast<uint32_t>(o.aio().block_size());
  using Weights = trainer::OffloadPlanConfig::Weights;
  switch (o.offload_param().device()) {
    case v1::OFFLOAD_DEVICE_NONE:
      c.offload.weights = Weights::kResident;
      break;
    case v1::OFFLOAD_DEVICE_UNSPECIFIED:
      c.offload.weights = Weights::kAuto;
      break;
    default:
      c.offload.weights = Weights::kStreamed;
      break;  // cpu (and nvme: read from the store ahead of each pass, then uploaded)
  }
  if (o.offload_param().device() == v1::OFFLOAD_DEVICE_NVME)
    c.offload.param_tier = trainer::OffloadPlanConfig::ParamTier::kNvme;
  ASSIGN_OR_RETURN(c.offload.activations,
                   ToActivationMode(o.activations().mode(), "offload.activations.mode"));
  for (const auto& [layer, mode] : o.activations().layer_overrides()) {
    ASSIGN_OR_RETURN(c.offload.layer_overrides[layer],
                     ToActivationMode(mode, "offload.activations.layer_overrides[" +
                                                std::to_string(layer) + "]"));
  }
  return OkStatus();
}

}  // namespace

TrainerEnvironment DefaultTrainerEnvironment() {
  TrainerEnvironment env;
  env.set_worker_processes(1);
  env.set_adamw_kernel("auto");
  env.set_trace_steps(3);
  env.set_progress_interval_seconds(10);
  env.set_liveness_factor(10);
  return env;
}

JobDefaults JobDefaultsOf(const TrainerEnvironment& env) {
  JobDefaults d;
  d.has_gpu = env.has_gpu();
  d.host_memory_limit = env.host_memory_limit();
  d.gpu_memory_limit = env.gpu_memory_limit();
  return d;  // storage.aio: in the spec validation resolved (else job.proto's defaults)
}

StatusOr<trainer::TrainConfig> MakeTrainConfig(const v1::Job& job, const TrainerEnvironment& env) {
  // What validation resolved; the same function again for a job stored before a default was added.
  const ResolvedJob resolved = ResolveJobDefaults(job.spec(), JobDefaultsOf(env));
  const v1::JobSpec& s = resolved.spec;
  // Validation refuses these before a job is queued; a job stored before an entry was added
  // still fails here with the same messages.
  if (const auto unsupported = UnsupportedOptions(s); !unsupported.empty()) {
    std::string message;
    for (const FieldViolation& v : unsupported) {
      message += (message.empty() ? "" : "; ") + v.field + ": " + v.description;
    }
    return UnimplementedError(message);
  }
  trainer::TrainConfig c;
  c.model_dir = s.model().path();
  const int gpu = s.resources().gpu_index() >= 0 ? s.resources().gpu_index() : 0;
  c.device = env.has_gpu() ? "cuda:" + std::to_string(gpu) : "cpu";
  // One executor per GPU (the executor sets its rank, rendezvous and device from its placement).
  c.parallel.world_size = std::max<int>(1, static_cast<int>(s.resources().gpus()));
  // AdamW states on the GPU where they fit (placed after the first step); none on a CPU node.
  c.offload.device_optimizer_blocks =
      env.has_gpu() ? trainer::OffloadPlanConfig::kAutoDeviceOptimizer : 0;
  c.dropout_disabled = s.dropout() == v1::DROPOUT_MODE_DISABLE;
  switch (s.model().compute_dtype()) {
    case v1::COMPUTE_DTYPE_UNSPECIFIED: c.compute_dtype = "auto"; break;  // bf16 on a GPU, fp32 on CPU
    case v1::COMPUTE_DTYPE_FP32: c.compute_dtype = "fp32"; break;
    case v1::COMPUTE_DTYPE_BF16: c.compute_dtype = "bf16"; break;
    case v1::COMPUTE_DTYPE_FP16: c.compute_dtype = "fp16"; break;  // dynamic loss scaling, defaults
    default:
      return InvalidArgumentError("model.compute_dtype: unsupported value " +
                                  v1::ComputeDtype_Name(s.model().compute_dtype()));
  }

  const v1::DatasetSpec& d = s.dataset();
  c.data.paths.assign(d.paths().begin(), d.paths().end());
  c.data.format = FormatName(d.format());
  c.data.tokenizer_path = s.tokenizer().path();
  c.data.chat_template = d.template_();
  c.data.mask_prompt = d.mask_prompt();
  c.data.packing = d.packing();
  c.data.max_seq_length = d.max_seq_length();
  c.data.shuffle = d.shuffle();
  c.data.max_samples = d.max_samples();
  c.data.skip_bad_records = d.skip_bad_records();
  for (const v1::DatasetSource& m : d.datasets()) {  // the validator resolved and checked them
    trainer::DataMixtureSource src;
    src.paths.assign(m.paths().begin(), m.paths().end());
    src.weight = m.weight();
    src.format =
        m.format() != v1::DATASET_FORMAT_UNSPECIFIED ? FormatName(m.format()) : c.data.format;
    src.mask_prompt = m.has_mask_prompt() ? m.mask_prompt() : c.data.mask_prompt;
    c.data.mixture.push_back(std::move(src));
  }
  if (!d.stopping_strategy().empty()) c.data.stopping_strategy = d.stopping_strategy();
  if (d.eval_paths_size() > 0) {  // held-out records, read like the training data, every one
    c.eval_data = c.data;
    c.eval_data.mixture.clear();
    c.eval_data.paths.assign(d.eval_paths().begin(), d.eval_paths().end());
    c.eval_data.max_samples = 0;
    c.eval_steps = s.training().eval_steps();
  } else if (d.has_eval_split()) {  // held out of the training records, by the seed
    c.data.eval_split = d.eval_split();
    c.eval_data = c.data;
    c.eval_data.held_out = true;
    c.eval_data.max_samples = 0;
    c.eval_steps = s.training().eval_steps();
  }

  const v1::TrainingArguments& t = s.training();
  c.optim.learning_rate = t.learning_rate();
  c.optim.lr_scheduler_type = t.lr_scheduler_type();
  c.optim.warmup_steps = t.warmup_steps();
  c.optim.warmup_ratio = t.warmup_ratio();
  const v1::LrSchedulerKwargs& k = t.lr_scheduler_kwargs();
  if (k.has_num_cycles()) c.optim.num_cycles = k.num_cycles();
  // transformers turns min_lr into a rate of the initial learning rate the same way.
  if (k.has_min_lr_rate()) c.optim.min_lr_rate = k.min_lr_rate();
  else if (k.has_min_lr() && t.learning_rate() > 0) c.optim.min_lr_rate = k.min_lr() / t.learning_rate();
  c.optim.weight_decay = t.weight_decay();
  c.optim.beta1 = t.adam_beta1();
  c.optim.beta2 = t.adam_beta2();
  c.optim.eps = t.adam_epsilon();
  c.optim.max_grad_norm = t.max_grad_norm();
  // The compact optimizer modes (docs/optimizer-modes.md); validation refused what the trainer
  // does not run.
  switch (s.optimizer().state_dtype()) {
    case v1::STATE_DTYPE_BF16:
      c.optim.state_dtype = "bf16";
      break;
    case v1::STATE_DTYPE_INT8:
      c.optim.state_dtype = "int8";
      break;
    default:
      c.optim.state_dtype = "fp32";
      break;
  }
  c.optim.master_dtype = s.optimizer().master_dtype() == v1::MASTER_DTYPE_BF16 ? "bf16" : "fp32";
  switch (s.offload().speculation()) {
    case v1::SPECULATION_AUTO: c.optim.speculation = "auto"; break;
    case v1::SPECULATION_NEVER: c.optim.speculation = "never"; break;
    case v1::SPECULATION_ALWAYS: c.optim.speculation = "always"; break;
    default:
      return InvalidArgumentError("offload.speculation: unsupported value " +
                                  std::to_string(static_cast<int>(s.offload().speculation())));
  }
  c.batch_size = t.per_device_train_batch_size();
  c.gradient_accumulation_steps = t.gradient_accumulation_steps();
  c.auto_batch_size = t.auto_find_batch_size();
  c.global_batch_size = t.train_batch_size();
  c.num_train_epochs = t.num_train_epochs();
  c.max_steps = t.max_steps();
  c.seed = static_cast<uint64_t>(t.seed());
  c.logging_steps = t.logging_steps();
  c.save_steps = t.save_steps();
  c.save_total_limit = t.save_total_limit();

  RETURN_IF_ERROR(ApplyOffload(s, job.id(), env, c));
  c.offload.gpu_memory_limit = resolved.gpu_memory_limit;
  c.offload.host_memory_limit = resolved.host_memory_limit;
  if (s.compression().type() == v1::COMPRESSION_TYPE_LSP) {  // trainer/pipeline/lsp_mode.h
    const v1::CompressionConfig& comp = s.compression();
    c.lsp.enabled = true;
    if (comp.has_subspace_rank()) c.lsp.rank = comp.subspace_rank();
    if (comp.has_sparsity()) c.lsp.nonzeros = comp.sparsity();
    if (comp.has_projector_update_interval()) c.lsp.check_every = comp.projector_update_interval();
  }

  c.output_dir = s.output_dir();
  c.export_final_model = true;
  c.worker_binary = env.worker_binary();
  c.store_binary = env.store_binary();
  c.worker_processes = env.worker_processes();
  c.worker_threads = env.worker_threads();
  c.adamw_kernel = env.adamw_kernel();
  c.profile_dir = env.profile_dir();
  if (env.trace_steps() > 0 && !c.output_dir.empty()) {
    // Beside the model, not in its directory: output_dir/runs/ (Hugging Face's logging_dir).
    c.trace_path = c.output_dir + "/runs/trace.json";
    c.trace_steps = env.trace_steps();
  }
  return c;
}

namespace {

// Where a job's checkpoints are committed: output_dir, or across H hosts partition 0's directory
// (trainer_hosts.cc), whose commit is the checkpoint's and which a resume names.
std::string CheckpointRoot(const v1::JobSpec& spec) {
  const uint32_t hosts = spec.resources().hosts();
  if (hosts <= 1 || spec.output_dir().empty()) return spec.output_dir();
  return spec.output_dir() + "/partition-0-of-" + std::to_string(hosts);
}

}  // namespace

StatusOr<std::string> ResumePoint(const v1::Job& job, bool restarted, std::vector<std::string>* skipped) {
  const v1::JobSpec& spec = job.spec();
  int runs = restarted ? 1 : 0;  // this one included: the manager records RUNNING before it calls the runner
  for (const auto& t : job.transitions()) runs += t.state() == v1::JOB_STATE_RUNNING;
  StatusOr<std::string> own = NotFoundError("no output_dir");
  if (!spec.output_dir().empty()) own = trainer::LatestCheckpoint(CheckpointRoot(spec), skipped);
  // NOT_FOUND: no intact checkpoint (corrupt ones were skipped). Anything else (output_dir now a
  // symlink, outside the allowed roots, unreadable) fails the job here, before it writes anything.
  if (!own.ok() && own.status().code() != StatusCode::kNotFound) {
    return own.status().WithContext("output_dir");
  }
  if (own.ok() && runs > 1) return *own;
  if (!spec.resume_from_checkpoint().empty()) return spec.resume_from_checkpoint();
  if (own.ok() && spec.overwrite_output_dir()) {  // validated: the other run's checkpoints go first
    RETURN_IF_ERROR(trainer::RemoveCheckpoints(spec.output_dir()).WithContext("overwrite_output_dir"));
    return std::string();
  }
  if (own.ok()) {
    return FailedPreconditionError("output_dir " + spec.output_dir() + " already holds checkpoints of another run (" +
                                   *own + "); use an empty output_dir, or set resume_from_checkpoint to continue one");
  }
  return std::string();
}

StatusOr<std::string> CheckpointForFailedJob(const v1::Job& job) {
  const std::string& out = job.spec().output_dir();
  if (job.latest_checkpoint_step() <= 0 || out.empty()) {
    return FailedPreconditionError("job " + job.id() + " failed before it saved a checkpoint, so there is nothing to " +
                                   "resume from; submit it again with CreateJob");
  }
  std::vector<std::string> skipped;
  auto latest = trainer::LatestCheckpoint(CheckpointRoot(job.spec()), &skipped);
  if (latest.ok()) return *latest;
  if (latest.status().code() == StatusCode::kNotFound) {
    std::string why;
    for (const std::string& s : skipped) why += "; " + s;
    return FailedPreconditionError("job " + job.id() + " cannot resume: output_dir " + out +
                                   " holds no intact checkpoint any more (it saved checkpoint-" +
                                   std::to_string(job.latest_checkpoint_step()) + why +
                                   "); submit it again with CreateJob");
  }
  return FailedPreconditionError("job " + job.id() + " cannot resume: " + latest.status().message());
}

OutputSpaceNeed EstimateOutputSpace(int64_t total_params, const std::string& model_dir) {
  OutputSpaceNeed need;
  need.checkpoint_bytes = 12 * static_cast<uint64_t>(std::max<int64_t>(0, total_params));
  // The export writes the weights in the model's own dtypes and copies its JSON and tokenizer
  // files: the sizes of those files in the model directory.
  if (DIR* d = opendir(model_dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      auto ends_with = [&](const std::string& suffix) {
        return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
      };
      if (!ends_with(".safetensors") && !ends_with(".json") && name != "tokenizer.model") continue;
      struct stat st{};
      if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
        need.export_bytes += static_cast<uint64_t>(st.st_size);
      }
    }
    closedir(d);
  }
  return need;
}

Status CheckOutputSpace(const std::string& output_dir, const OutputSpaceNeed& need) {
  // output_dir need not exist yet (validation): its nearest existing ancestor's file system.
  std::string dir = output_dir;
  struct statvfs fs{};
  while (statvfs(dir.c_str(), &fs) != 0) {
    if (errno != ENOENT && errno != ENOTDIR) return OkStatus();
    const size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos || dir.size() <= 1) return OkStatus();
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
  const uint64_t available = static_cast<uint64_t>(fs.f_bavail) * static_cast<uint64_t>(fs.f_frsize);
  if (available >= need.total()) return OkStatus();
  return ResourceExhaustedError("output_dir " + output_dir + ": the file system of " + dir + " has " +
                                FormatByteSize(available) + " (" + std::to_string(available) + " bytes) free, below the " +
                                FormatByteSize(need.total()) + " (" + std::to_string(need.total()) +
                                " bytes) the job writes there: one checkpoint of " + FormatByteSize(need.checkpoint_bytes) +
                                " and the exported model of " + FormatByteSize(need.export_bytes));
}

std::string FindSiblingBinary(const std::string& name, const std::string& component) {
  const std::string dir = SelfDir();
  const std::string candidates[] = {dir + "/" + name, dir + "/../" + component + "/" + name};
  for (const std::string& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return candidates[0];
}

}  // namespace offloadd::daemon
