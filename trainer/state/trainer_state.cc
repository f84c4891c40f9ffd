// Trainer: checkpoints (save, restore), the final Hugging Face export and the Train() loop.
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/file.h"
#include "common/safe_path.h"
#include "engine/torch_boundary.h"
#include "trainer/state/checkpoint.h"
#include "trainer/state/export_files.h"
#include "trainer/state/partition_checkpoint.h"
#include "trainer/trainer_impl.h"

namespace offloadd::trainer {
namespace {

constexpr char kLspStateFile[] = "lsp_state.safetensors";

std::vector<ParamSpec> SpecsOf(const BlockLayout& bl) {
  std::vector<ParamSpec> out;
  for (const auto& s : bl.params) out.push_back({s.param->name, s.shape});
  return out;
}

// Reads block b's fp32 states from checkpoint `r` into the buffers (resized); returns its AdamW
// step. A compact mode's states go into the regions instead (sized by the caller), m and v stay
// empty; a bf16 master's region into w_region.
StatusOr<int64_t> ReadLayerStates(CheckpointReader& r, const BlockLayout& layout, int b,
                                  std::vector<float>* master, std::vector<float>* m,
                                  std::vector<float>* v, workers::OptimizerMode mode = {},
                                  std::vector<uint8_t>* m_region = nullptr,
                                  std::vector<uint8_t>* v_region = nullptr,
                                  std::vector<uint8_t>* w_region = nullptr) {
  master->resize(layout.numel);
  LayerTarget t;
  t.params = SpecsOf(layout);
  t.master = {std::span<float>(*master)};
  if (!mode.Exact()) {
    t.state_dtype = std::string(workers::StateDtypeName(mode.state));
    t.exp_avg_region = *m_region;
    t.exp_avg_sq_region = *v_region;
    t.master_dtype = std::string(workers::MasterDtypeName(mode.master));
    if (w_region != nullptr) t.master_region = *w_region;
    return r.ReadLayer(b, t);
  }
  m->resize(layout.numel);
  v->resize(layout.numel);
  t.exp_avg = {std::span<float>(*m)};
  t.exp_avg_sq = {std::span<float>(*v)};
  return r.ReadLayer(b, t);
}

// A file of the model directory copied into each checkpoint: through the confined open (a symlink
// out of the allowed roots, a FIFO or a file the job's user cannot read fails the checkpoint,
// naming it). One that is not there is not copied.
StatusOr<std::optional<std::string>> ReadModelFile(const std::string& path) {
  StatusOr<std::string> text = ReadFileConfined(path);
  if (text.ok()) return std::optional<std::string>(std::move(*text));
  if (text.status().code() == StatusCode::kNotFound) return std::optional<std::string>();
  return text.status().WithContext("copying the model's " + path.substr(path.rfind('/') + 1) +
                                   " into the checkpoint");
}

}  // namespace

std::string Trainer::Impl::Fingerprint() const {
  std::vector<std::vector<ParamSpec>> layers;
  for (const auto& bl : layout) layers.push_back(SpecsOf(bl));
  // LSP checkpoints hold subspace coordinates where exact ones hold weights: "llama+lsp" says so
  // when one is offered to the other mode.
  return ModelFingerprint(model->config().model_type + (pipeline.lsp ? "+lsp" : ""), layers);
}

Status Trainer::Impl::CheckOptimizerMode() {
  ASSIGN_OR_RETURN(optimizer_mode,
                   workers::ParseOptimizerMode(cfg.optim.state_dtype, cfg.optim.master_dtype));
  // The names the checkpoints record ("" is fp32).
  cfg.optim.state_dtype = std::string(workers::StateDtypeName(optimizer_mode.state));
  cfg.optim.master_dtype = std::string(workers::MasterDtypeName(optimizer_mode.master));
  if (optimizer_mode.Exact()) return OkStatus();
  const std::string mode = "optimizer mode " + optimizer_mode.Describe();
  if (optimizer_mode.master == workers::MasterDtype::kBf16 && dtype != c10::kBFloat16) {
    return UnimplementedError("optimizer.master_dtype bf16 with " +
                              std::string(dtype == c10::kFloat ? "fp32" : "fp16") +
                              " compute: the bf16 master is the device's bf16 weights; use "
                              "compute_dtype bf16 (--dtype=bf16) or an fp32 master");
  }
  if (cfg.lsp.enabled) {
    return UnimplementedError(mode +
                              " with compression lsp: LSP keeps its own fp32 subspace "
                              "states");
  }
  if (cfg.parallel.world_size > 1) {
    // Ranks of one host share rank 0's arena: its workers step every block's compact states, the
    // other ranks read only the weights rank 0 publishes (the 16-bit copy, or a bf16 master
    // itself). What they would read as fp32 is refused by name.
    const std::string dp = mode + " with data parallelism (world size " +
                           std::to_string(cfg.parallel.world_size) + ")";
    if (cfg.offload.tier == StateTier::kNvme) {
      return UnimplementedError(dp +
                                " and the optimizer states on NVMe is not built yet; use "
                                "offload_optimizer.device cpu or exact states");
    }
    if (cfg.parallel.hosts > 1) {
      return UnimplementedError(dp + " across " + std::to_string(cfg.parallel.hosts) +
                                " hosts: each host's slice of the states is fp32");
    }
    if (cfg.offload.device_optimizer_blocks > 0 || cfg.offload.device_optimizer_share >= 0) {
      return UnimplementedError(dp + " and optimizer states on the GPU (device_optimizer_blocks " +
                                std::to_string(cfg.offload.device_optimizer_blocks) +
                                "): each rank's replica starts from fp32 states; leave it auto "
                                "(none with data parallelism) or 0");
    }
    cfg.offload.device_optimizer_blocks = 0;  // auto places none: every state in the arena
  }
  return OkStatus();
}

Status Trainer::Impl::ReadBlockStates(int b, float* master, float* exp_avg, float* exp_avg_sq) {
  if (pipeline.device_opt && pipeline.device_opt->owns(b))
    return pipeline.device_opt->ReadStates(b, master, exp_avg, exp_avg_sq);
  return host->ReadStates(b, master, exp_avg, exp_avg_sq);
}

Status Trainer::Impl::RestoreBlockStates(int b, const float* master, const float* exp_avg,
                                         const float* exp_avg_sq, uint64_t adam_step) {
  if (pipeline.device_opt && pipeline.device_opt->owns(b))
    return pipeline.device_opt->RestoreStates(b, master, exp_avg, exp_avg_sq);
  return host->RestoreStates(b, master, exp_avg, exp_avg_sq, adam_step);
}

StatusOr<std::string> Trainer::Impl::SaveCheckpoint() {
  if (cfg.output_dir.empty()) return FailedPreconditionError("no output_dir to write checkpoints to");
  // Data parallel on one host: rank 0 holds the states and writes them. Across hosts every
  // host's leader writes its partition (PartitionDir).
  if (!host_leader()) return std::string();
  RETURN_IF_ERROR(Flush());
  const std::string out_dir = across_hosts() ? PartitionDir(host_index()) : cfg.output_dir;
  ASSIGN_OR_RETURN(CheckpointWriter w, CheckpointWriter::Begin(out_dir, completed));
  std::vector<float> master, m, v;
  std::vector<uint8_t> m_region, v_region, w_region;  // compact states, in their own format
  const bool compact = !optimizer_mode.Exact();
  const bool bf16_master = optimizer_mode.master == workers::MasterDtype::kBf16;
  for (int b = 0; b < n; ++b) {
    const uint64_t numel = across_hosts() ? host->elements(b) : layout[b].numel;
    master.resize(numel);
    LayerState ls;
    if (compact) {
      RETURN_IF_ERROR(ReadBlockStates(b, master.data(), nullptr, nullptr));
      m_region.resize(host->state_region_bytes(b));
      v_region.resize(host->state_region_bytes(b));
      const bool on_device = pipeline.device_opt && pipeline.device_opt->owns(b);
      RETURN_IF_ERROR(
          on_device ? pipeline.device_opt->ReadRegions(b, nullptr, m_region.data(), v_region.data())
                    : host->ReadStateRegions(b, m_region.data(), v_region.data()));
      ls.state_dtype = std::string(workers::StateDtypeName(optimizer_mode.state));
      ls.exp_avg_region = m_region;
      ls.exp_avg_sq_region = v_region;
      if (bf16_master) {  // the region itself: fp32 master values do not restore it bit for bit
        w_region.resize(host->master_region_bytes(b));
        RETURN_IF_ERROR(on_device
                            ? pipeline.device_opt->ReadRegions(b, w_region.data(), nullptr, nullptr)
                            : host->ReadMasterRegion(b, w_region.data()));
        ls.master_dtype = "bf16";
        ls.master_region = w_region;
      }
    } else {
      m.resize(numel);
      v.resize(numel);
      RETURN_IF_ERROR(ReadBlockStates(b, master.data(), m.data(), v.data()));
      ls.exp_avg = {std::span<const float>(m)};
      ls.exp_avg_sq = {std::span<const float>(v)};
    }
    ls.params = SpecsOf(layout[b]);
    if (across_hosts()) ls.params = {ParamSpec{SliceName(b), {static_cast<int64_t>(numel)}}};
    ls.master = {std::span<const float>(master)};
    ls.adam_step = pipeline.accounting->applied();
    RETURN_IF_ERROR(w.WriteLayer(b, ls));
  }
  if (pipeline.lsp) {  // projectors, W_base and the switch count (lsp/README.md)
    ASSIGN_OR_RETURN(const std::string lsp_state, pipeline.lsp->Serialize());
    RETURN_IF_ERROR(w.AddFile(kLspStateFile, lsp_state));
  }
  for (const char* f : {"config.json", "generation_config.json"}) {
    ASSIGN_OR_RETURN(std::optional<std::string> text, ReadModelFile(cfg.model_dir + "/" + f));
    if (text) RETURN_IF_ERROR(w.AddFile(f, *text));
  }
  ASSIGN_OR_RETURN(const auto tokenizer, TokenizerFiles());
  for (const auto& [name, contents] : tokenizer) RETURN_IF_ERROR(w.AddFile(name, contents));
  TrainerState st;
  st.global_step = completed;
  st.max_steps = total;
  st.epoch = data->epoch();
  st.seed = cfg.seed;
  st.data_cursor = data->State();
  st.scheduler = {cfg.optim.lr_scheduler_type, cfg.optim.learning_rate, lr_schedule->warmup_steps(),
                  total};
  st.model_fingerprint = across_hosts() ? PartitionFingerprint(host_index()) : Fingerprint();
  st.state_dtype = std::string(workers::StateDtypeName(optimizer_mode.state));
  st.master_dtype = std::string(workers::MasterDtypeName(optimizer_mode.master));
  if (scaler) st.grad_scaler = scaler->state();
  if (cfg.auto_batch_size) st.auto_batch = TrainerState::BatchShape{cfg.batch_size, cfg.gradient_accumulation_steps};
  st.log_history = pipeline.accounting->loss_history();
  st.hf.logging_steps = cfg.logging_steps;
  st.hf.eval_steps = cfg.eval_steps > 0 ? cfg.eval_steps : cfg.logging_steps;
  st.hf.save_steps = cfg.save_steps;
  st.hf.train_batch_size = static_cast<int64_t>(cfg.batch_size) * cfg.gradient_accumulation_steps;
  st.hf.num_train_epochs = cfg.num_train_epochs;
  // Across hosts partition 0 is committed last, once every other one is: its commit is the
  // checkpoint's.
  if (across_hosts() && leader()) RETURN_IF_ERROR(AwaitPartitions(completed));
  ASSIGN_OR_RETURN(CheckpointInfo info, w.Commit(st));
  RETURN_IF_ERROR(PruneCheckpoints(out_dir, cfg.save_total_limit));
  if (across_hosts() && !leader()) {
    RETURN_IF_ERROR(PublishPartition(completed, info.path));
    return info.path;
  }
  if (obs)
    obs->OnCheckpoint(info.path, info.step, info.size_bytes, pipeline.accounting->last_loss());
  Log(TrainObserver::Level::kInfo, "checkpoint " + info.path + " written");
  return info.path;
}

Status Trainer::Impl::RestoreCheckpoint(const std::string& dir) {
  if (across_hosts()) return RestorePartition(dir);  // every rank its own partition
  if (!leader()) return RestoreFollower(dir);
  RETURN_IF_ERROR(Flush());
  ASSIGN_OR_RETURN(
      CheckpointReader r,
      CheckpointReader::Open(dir, Fingerprint(), cfg.optim.state_dtype, cfg.optim.master_dtype));
  if (r.num_layers() != n) {
    return FailedPreconditionError(dir + ": has " + std::to_string(r.num_layers()) +
                                   " layers, the model " + std::to_string(n));
  }
  std::vector<float> master, m, v;
  std::vector<uint8_t> m_region, v_region, w_region;
  const bool bf16_master = optimizer_mode.master == workers::MasterDtype::kBf16;
  int64_t adam_steps = -1;
  for (int b = 0; b < n; ++b) {
    if (!optimizer_mode.Exact()) {  // compact states, in their own format
      m_region.resize(host->state_region_bytes(b));
      v_region.resize(host->state_region_bytes(b));
    }
    if (bf16_master) w_region.resize(host->master_region_bytes(b));
    ASSIGN_OR_RETURN(const int64_t adam_step,
                     ReadLayerStates(r, layout[b], b, &master, &m, &v, optimizer_mode, &m_region,
                                     &v_region, bf16_master ? &w_region : nullptr));
    if (adam_steps >= 0 && adam_step != adam_steps) {
      return DataLossError(dir + ": layer " + std::to_string(b) + " has AdamW step " +
                           std::to_string(adam_step) + ", layer 0 " + std::to_string(adam_steps));
    }
    adam_steps = adam_step;
    if (optimizer_mode.Exact()) {
      RETURN_IF_ERROR(RestoreBlockStates(b, master.data(), m.data(), v.data(),
                                         static_cast<uint64_t>(adam_step)));
    } else {
      RETURN_IF_ERROR(
          RestoreBlockStates(b, master.data(), nullptr, nullptr, static_cast<uint64_t>(adam_step)));
      if (pipeline.device_opt && pipeline.device_opt->owns(b)) {
        RETURN_IF_ERROR(pipeline.device_opt->RestoreRegions(
            b, bf16_master ? w_region.data() : nullptr, m_region.data(), v_region.data()));
      } else {
        RETURN_IF_ERROR(host->RestoreStateRegions(b, m_region.data(), v_region.data()));
        if (bf16_master) RETURN_IF_ERROR(host->RestoreMasterRegion(b, w_region.data()));
      }
    }
  }
  const TrainerState& st = r.state();
  RETURN_IF_ERROR(data->Restore(st.data_cursor));
  if (adam_steps > st.global_step) {
    return DataLossError(dir + ": AdamW step " + std::to_string(adam_steps) +
                         " is beyond global_step " + std::to_string(st.global_step));
  }
  if (scaler) {
    if (st.grad_scaler) {
      RETURN_IF_ERROR(scaler->Restore(*st.grad_scaler));
    } else {
      Log(TrainObserver::Level::kWarning,
          dir + " has no loss scale (not an fp16 run): starting from init_scale");
    }
  }
  completed = st.global_step;
  pipeline.accounting->Restore(adam_steps, st.log_history);
  if (dp) RETURN_IF_ERROR(dp->Set("resume-adam-steps", std::to_string(adam_steps)));  // RestoreFollower
  RETURN_IF_ERROR(
      host->ResumeAt(static_cast<uint64_t>(completed), static_cast<uint64_t>(adam_steps)));
  if (pipeline.lsp) {
    const std::string path = dir + "/" + kLspStateFile;
    if (access(path.c_str(), F_OK) != 0) {
      return FailedPreconditionError(dir + ": has no " + kLspStateFile + " (not an LSP checkpoint)");
    }
    RETURN_IF_ERROR(pipeline.lsp->Restore(path));
    for (int b = 0; b < n; ++b)
      RETURN_IF_ERROR(pipeline.lsp->OnUpdated(b, host->master_weights(b)));
  }
  RETURN_IF_ERROR(pipeline.weights->Reload());
  Log(TrainObserver::Level::kInfo,
      "resumed from " + dir + " at step " + std::to_string(completed) + " of " + std::to_string(total));
  return OkStatus();
}

// Data parallel, ranks > 0: rank 0 restores the states into the arena (RestoreCheckpoint).
Status Trainer::Impl::RestoreFollower(const std::string& dir) {
  RETURN_IF_ERROR(Flush());
  // The states are rank 0's to read; this rank needs the step, the data position and the history.
  ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::Open(dir, Fingerprint()));
  const TrainerState& st = r.state();
  RETURN_IF_ERROR(data->Restore(st.data_cursor));
  if (scaler && st.grad_scaler) RETURN_IF_ERROR(scaler->Restore(*st.grad_scaler));
  completed = st.global_step;
  // The AdamW updates applied (fewer than the steps when fp16 skipped some) set the learning rate
  // and the device blocks' AdamW step on every rank: rank 0 read them from the layers.
  ASSIGN_OR_RETURN(const std::string applied_text, dp->Get("resume-adam-steps"));
  const int64_t adam_steps = std::stoll(applied_text);
  pipeline.accounting->Restore(adam_steps, st.log_history);
  // This rank's replicas of the blocks whose states live on the GPUs (an explicit placement;
  // auto places them again from the arena after this run's first steps).
  std::vector<float> master, m, v;
  for (int b = 0; pipeline.device_opt && b < n; ++b) {
    if (!pipeline.device_opt->owns(b)) continue;
    RETURN_IF_ERROR(ReadLayerStates(r, layout[b], b, &master, &m, &v).status());
    RETURN_IF_ERROR(pipeline.device_opt->RestoreStates(b, master.data(), m.data(), v.data()));
  }
  RETURN_IF_ERROR(host->ResumeAt(static_cast<uint64_t>(completed), static_cast<uint64_t>(adam_steps)));
  RETURN_IF_ERROR(pipeline.weights->Reload());
  Log(TrainObserver::Level::kInfo, "rank " + std::to_string(dp->rank()) + " resumed from " + dir + " at step " +
                                       std::to_string(completed));
  return OkStatus();
}

Status Trainer::Impl::ExportModel(const std::string& dir) {
  RETURN_IF_ERROR(Flush());
  std::vector<at::Tensor> gathered;  // across hosts: every rank's slices, on every rank
  if (across_hosts()) {
    ASSIGN_OR_RETURN(gathered, GatherMasters());
  }
  if (!leader()) return OkStatus();  // data parallel: rank 0 exports
  // Held while the files are written: a resume's cleanup leaves this export's temporaries alone.
  ASSIGN_OR_RETURN(ExportLock lock, ExportLock::Acquire(dir));
  std::vector<float> m, v;
  for (int b = 0; b < n; ++b) {
    const int64_t numel = static_cast<int64_t>(layout[b].numel);
    if (!gathered.empty()) {
      layout[b].Bind(gathered[b]);
      continue;
    }
    at::Tensor master = at::empty({numel}, at::kFloat);
    if (!optimizer_mode.Exact()) {  // the weights only (compact states are not fp32)
      RETURN_IF_ERROR(ReadBlockStates(b, master.data_ptr<float>(), nullptr, nullptr));
      layout[b].Bind(master);
      continue;
    }
    m.resize(numel);
    v.resize(numel);
    RETURN_IF_ERROR(ReadBlockStates(b, master.data_ptr<float>(), m.data(), v.data()));
    layout[b].Bind(master);
  }
  Status st = model->Export(dir);
  for (int b = 0; b < n; ++b) pipeline.weights->Rebind(b);  // back to the compute bindings
  RETURN_IF_ERROR(st);
  RETURN_IF_ERROR(ExportTokenizer(dir));
  return WriteModelCard(dir);
}

namespace {
constexpr const char* kTokenizerFileNames[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json",     "merges.txt",            "added_tokens.json",       "chat_template.jinja"};
}  // namespace

StatusOr<std::vector<std::pair<std::string, std::string>>> Trainer::Impl::TokenizerFiles() {
  std::map<std::string, std::string> files;
  const auto read_dir = [&files](const std::string& dir) -> Status {
    for (const char* f : kTokenizerFileNames) {
      ASSIGN_OR_RETURN(std::optional<std::string> text, ReadModelFile(JoinPath(dir, f)));
      if (text) files[f] = std::move(*text);
    }
    return OkStatus();
  };
  RETURN_IF_ERROR(read_dir(cfg.model_dir));
  // A separate tokenizer (tokenizer.path) replaces the model directory's copies, as in the export.
  const std::string& tok = cfg.data.tokenizer_path;
  if (!tok.empty()) {
    struct stat st {};
    if (::stat(tok.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      RETURN_IF_ERROR(read_dir(tok));
    } else {
      ASSIGN_OR_RETURN(std::optional<std::string> text, ReadModelFile(tok));
      if (text) files["tokenizer.json"] = std::move(*text);
    }
  }
  const DataSource::TemplateUse* use = data ? data->template_use() : nullptr;
  if (use != nullptr && !use->tokenizers_own) {
    files["chat_template.jinja"] = use->source;
    nlohmann::ordered_json config = nlohmann::ordered_json::object();
    if (auto it = files.find("tokenizer_config.json"); it != files.end()) {
      config = nlohmann::ordered_json::parse(it->second, nullptr, /*allow_exceptions=*/false);
      if (!config.is_object()) {
        return DataLossError("tokenizer_config.json: not a JSON object; the chat template cannot be added");
      }
    }
    config["chat_template"] = use->source;
    files["tokenizer_config.json"] = config.dump(2) + "\n";
  }
  return std::vector<std::pair<std::string, std::string>>(files.begin(), files.end());
}

Status Trainer::Impl::WriteModelCard(const std::string& dir) {
  ModelCardFacts f;
  f.model_dir = cfg.model_dir;
  if (auto config = ReadFileConfined(JoinPath(cfg.model_dir, "config.json")); config.ok()) {
    f.config_json = *config;
  }
  f.datasets = cfg.data.paths;
  for (const DataMixtureSource& m : cfg.data.mixture) {  // a mixture's files, dataset by dataset
    f.datasets.insert(f.datasets.end(), m.paths.begin(), m.paths.end());
  }
  f.eval_datasets = cfg.eval_data.paths;
  const auto num = [](double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  const auto& o = cfg.optim;
  f.hyperparameters = {
      {"learning_rate", num(o.learning_rate)},
      {"train_batch_size", std::to_string(cfg.batch_size)},
      {"gradient_accumulation_steps", std::to_string(cfg.gradient_accumulation_steps)},
      {"total_train_batch_size",
       std::to_string(static_cast<int64_t>(cfg.batch_size) * cfg.gradient_accumulation_steps *
                      std::max(1, cfg.parallel.world_size))},
      {"max_seq_length", std::to_string(cfg.data.max_seq_length)},
      {"optimizer", "adamw_torch with betas=(" + num(o.beta1) + "," + num(o.beta2) + ") and epsilon=" +
                        num(o.eps)},
      {"weight_decay", num(o.weight_decay)},
      {"max_grad_norm", num(o.max_grad_norm)},
      {"lr_scheduler_type", o.lr_scheduler_type},
      {"lr_scheduler_warmup_steps", std::to_string(lr_schedule ? lr_schedule->warmup_steps() : o.warmup_steps)},
      {"training_steps", std::to_string(total)},
      {"seed", std::to_string(cfg.seed)},
      {"compute_dtype", cfg.compute_dtype},
  };
  f.steps = completed;
  if (completed > 0) f.final_loss = pipeline.accounting->last_loss();
  f.eval_loss = eval.loss;
  return WriteFileAtomically(JoinPath(dir, "README.md"), ModelCard(f)).WithContext("export");
}

Status Trainer::Impl::ExportTokenizer(const std::string& dir) {
  // A separate tokenizer (tokenizer.path) replaces the model directory's copies: a directory's
  // tokenizer files, or the one tokenizer.json file given.
  const std::string& tok = cfg.data.tokenizer_path;
  if (!tok.empty()) {
    struct stat st {};
    if (::stat(tok.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                            "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja"}) {
        const std::string from = JoinPath(tok, f);
        if (::lstat(from.c_str(), &st) != 0) continue;
        RETURN_IF_ERROR(CopyFileConfined(from, JoinPath(dir, f)).WithContext("export"));
      }
    } else {
      RETURN_IF_ERROR(CopyFileConfined(tok, JoinPath(dir, "tokenizer.json")).WithContext("export"));
    }
  }
  // The chat template the records were rendered with travels with the model, so that
  // apply_chat_template on the fine-tuned model formats prompts as training did: written as
  // chat_template.jinja (which transformers prefers) and into tokenizer_config.json.
  const DataSource::TemplateUse* use = data ? data->template_use() : nullptr;
  if (use == nullptr || use->tokenizers_own) return OkStatus();
  RETURN_IF_ERROR(
      WriteFileAtomically(JoinPath(dir, "chat_template.jinja"), use->source).WithContext("export"));
  const std::string config_path = JoinPath(dir, "tokenizer_config.json");
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (auto text = ReadFileConfined(config_path); text.ok()) {
    config = nlohmann::ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) return DataLossError(config_path + ": not a JSON object; the chat template is not added");
  }
  config["chat_template"] = use->source;
  RETURN_IF_ERROR(WriteFileAtomically(config_path, config.dump(2) + "\n").WithContext("export"));
  Log(TrainObserver::Level::kInfo, "export: the chat template used in training (" + use->origin +
                                       ") written to chat_template.jinja and tokenizer_config.json");
  return OkStatus();
}

StatusOr<TrainResult> Trainer::Train(bool checkpoint_on_stop) {
  Impl& m = *impl_;
  TrainResult result;
  if (!m.cfg.resume_from.empty()) RETURN_IF_ERROR(m.RestoreCheckpoint(m.cfg.resume_from));
  auto write_trace = [&]() -> Status {
    if (m.cfg.trace_path.empty()) return OkStatus();
    // The trace goes in a directory of its own (output_dir/runs/, Hugging Face's logging_dir),
    // not beside the model's files.
    const size_t slash = m.cfg.trace_path.rfind('/');
    if (slash != std::string::npos && slash > 0) {
      ASSIGN_OR_RETURN(OwnedFd dir, MakeDirsConfined(m.cfg.trace_path.substr(0, slash)));
      (void)dir;
    }
    return m.pipeline.accounting->WriteTrace(m.cfg.trace_path);
  };
  auto evaluate = [&]() -> Status {
    return engine::RunTorch("evaluation", [&] { return m.Evaluate(); });
  };
  if (m.eval.data) RETURN_IF_ERROR(evaluate());  // the starting point (or the resumed step's)
  while (m.completed < m.total) {
    ASSIGN_OR_RETURN(const bool stop, m.StopAtBoundary());
    if (stop) {
      RETURN_IF_ERROR(m.Flush());
      if (checkpoint_on_stop && !m.cfg.output_dir.empty()) {
        ASSIGN_OR_RETURN(result.last_checkpoint, m.SaveCheckpoint());
      }
      RETURN_IF_ERROR(write_trace());
      return CancelledError("stopped at step " + std::to_string(m.completed));
    }
    RETURN_IF_ERROR(RunStep());
    if (m.eval.data && (m.completed % m.cfg.eval_steps == 0 || m.completed == m.total)) {
      RETURN_IF_ERROR(evaluate());
    }
    if (m.cfg.save_steps > 0 && m.completed % m.cfg.save_steps == 0 && m.completed < m.total &&
        !m.cfg.output_dir.empty()) {
      ASSIGN_OR_RETURN(result.last_checkpoint, m.SaveCheckpoint());
    }
  }
  RETURN_IF_ERROR(m.Flush());
  RETURN_IF_ERROR(write_trace());
  result.steps = m.completed;
  result.final_loss = m.pipeline.accounting->last_loss();
  // Across hosts every rank takes part: the masters are gathered from the hosts' slices.
  if (!m.cfg.output_dir.empty() && m.cfg.export_final_model && (m.leader() || m.across_hosts())) {
    if (m.model->has_checkpoint()) {
      RETURN_IF_ERROR(m.ExportModel(m.cfg.output_dir));
      result.exported_to = m.cfg.output_dir;
      m.Log(TrainObserver::Level::kInfo, "final model written to " + m.cfg.output_dir);
    } else {
      m.Log(TrainObserver::Level::kWarning, "random-init model: the final model is not exported");
    }
  }
  return result;
}

}  // namespace offloadd::trainer
