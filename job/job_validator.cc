#include "job/job_validator.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "common/file.h"
#include "common/message_text.h"
#include "common/safe_path.h"
#include "common/units.h"
#include "engine/model_config.h"
#include "job/capacity.h"
#include "job/dataset_mixture_checks.h"
#include "job/hf_names.h"
#include "job/job_validator_checks.h"
#include "job/sequence_positions.h"
#include "job/spec_refusals.h"
#include "job/state_placement.h"
#include "job/train_job_config.h"
#include "job/unsupported_options.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/gzip_reader.h"
#include "text/jinja.h"
#include "text/tokenizer.h"
#include "trainer/state/checkpoint.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;

bool IsDirectory(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool Exists(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0;
}

// Enum fields hold whatever number the client sent (proto3 open enums): name unknown ones.
void CheckEnums(const v1::JobSpec& s, Checker& c) {
  const auto check = [&](const char* field, bool valid, int value) {
    if (!valid) c.Add(field, "unknown value " + std::to_string(value));
  };
  check("model.compute_dtype", v1::ComputeDtype_IsValid(s.model().compute_dtype()), s.model().compute_dtype());
  check("dataset.format", v1::DatasetFormat_IsValid(s.dataset().format()), s.dataset().format());
  check("optimizer.state_dtype", v1::StateDtype_IsValid(s.optimizer().state_dtype()),
        s.optimizer().state_dtype());
  check("optimizer.master_dtype", v1::MasterDtype_IsValid(s.optimizer().master_dtype()),
        s.optimizer().master_dtype());
  check("offload.offload_optimizer.device", v1::OffloadDevice_IsValid(s.offload().offload_optimizer().device()),
        s.offload().offload_optimizer().device());
  check("offload.offload_param.device", v1::OffloadDevice_IsValid(s.offload().offload_param().device()),
        s.offload().offload_param().device());
  check("offload.activations.mode", v1::ActivationMode_IsValid(s.offload().activations().mode()),
        s.offload().activations().mode());
  for (const auto& [layer, mode] : s.offload().activations().layer_overrides()) {
    if (!v1::ActivationMode_IsValid(mode)) {
      c.Add("offload.activations.layer_overrides[" + std::to_string(layer) + "]", "unknown value " + std::to_string(mode));
    }
  }
  check("compression.type", v1::CompressionType_IsValid(s.compression().type()), s.compression().type());
}

// Every string and list the job record, its events and every listing carry is bounded: a 3.9 MB
// display name made `offloadctl list` fail for everyone and a 30-step job write 373 MiB of records.
void CheckSizes(const v1::JobSpec& s, Checker& c) {
  const auto at_most = [&](const std::string& field, size_t size, size_t max, const char* what) {
    if (size > max) {
      c.Add(field, std::to_string(size) + " " + what + ", more than the " + std::to_string(max) + " allowed");
    }
  };
  at_most("display_name", s.display_name().size(), kMaxDisplayNameBytes, "bytes");
  at_most("labels", s.labels_size(), kMaxLabels, "labels");
  for (const auto& [k, v] : s.labels()) {
    at_most("labels", k.size(), kMaxLabelKeyBytes, "bytes in a label key");
    at_most("labels", v.size(), kMaxLabelValueBytes, "bytes in a label value");
  }
  for (const auto& [field, path] :
       {std::pair{"model.path", &s.model().path()}, std::pair{"tokenizer.path", &s.tokenizer().path()},
        std::pair{"dataset.template", &s.dataset().template_()}, std::pair{"output_dir", &s.output_dir()},
        std::pair{"resume_from_checkpoint", &s.resume_from_checkpoint()},
        std::pair{"offload.offload_optimizer.nvme_path", &s.offload().offload_optimizer().nvme_path()},
        std::pair{"offload.offload_param.nvme_path", &s.offload().offload_param().nvme_path()}}) {
    at_most(field, path->size(), kMaxPathBytes, "bytes (PATH_MAX is 4096)");
  }
  at_most("dataset.paths", s.dataset().paths_size(), kMaxDatasetPaths, "files");
  for (int i = 0; i < s.dataset().paths_size(); ++i) {
    at_most("dataset.paths[" + std::to_string(i) + "]", s.dataset().paths(i).size(), kMaxPathBytes,
            "bytes (PATH_MAX is 4096)");
  }
  at_most("dataset.eval_paths", s.dataset().eval_paths_size(), kMaxDatasetPaths, "files");
  for (int i = 0; i < s.dataset().eval_paths_size(); ++i) {
    at_most("dataset.eval_paths[" + std::to_string(i) + "]", s.dataset().eval_paths(i).size(), kMaxPathBytes,
            "bytes (PATH_MAX is 4096)");
  }
  CheckMixtureSizes(s.dataset(), kMaxDatasetPaths, kMaxPathBytes, c);
  at_most("offload.activations.layer_overrides", s.offload().activations().layer_overrides_size(),
          kMaxLayerOverrides, "entries");
  at_most("spec", s.ByteSizeLong(), kMaxJobSpecBytes,
          "bytes serialized (all paths, labels and names together; the limit is 256 KiB)");
}

void CheckOffload(const v1::OffloadConfig& o, const NodeBudget& node, const PathPolicy& paths, Checker& c) {
  for (const auto& [target, name] : {std::pair{&o.offload_optimizer(), "offload.offload_optimizer"},
                                     std::pair{&o.offload_param(), "offload.offload_param"}}) {
    if (target->device() != v1::OFFLOAD_DEVICE_NVME) {
      if (!target->nvme_path().empty()) c.Add(std::string(name) + ".nvme_path", "set, but device is not nvme");
      continue;
    }
    if (node.store_dirs.empty()) {
      std::string why = "none is configured in the daemon (storage.directories)";
      if (!node.unusable_store_dirs.empty()) {
        // Configured, but missing or not writable: name them, not "none is configured".
        why.clear();
        for (const auto& d : node.unusable_store_dirs) {
          why += (why.empty() ? "" : "; ") + std::string("storage.directories entry ") + d.path + " is unusable (" +
                 d.problem + ")";
        }
      }
      c.Add(std::string(name) + ".device", "nvme needs store directories; " + why);
      continue;
    }
    if (!target->nvme_path().empty()) {
      auto real = paths.ResolveExisting(target->nvme_path());
      bool known = false;
      for (const auto& d : node.store_dirs) known = known || (real.ok() && *real == d.path) || target->nvme_path() == d.path;
      if (!known) {
        std::string list;
        for (const auto& d : node.store_dirs) list += (list.empty() ? "" : ", ") + d.path;
        c.Add(std::string(name) + ".nvme_path", "'" + target->nvme_path() + "' is not one of the daemon's store directories [" + list + "]");
      }
    }
  }
  if (o.offload_param().has_ratio()) {
    c.Add("offload.offload_param.ratio", "only offload_optimizer takes a ratio (the share of its states kept off the GPU)");
  }
  // Settings that would not act are refused rather than echoed back. The 16-bit weights go to the
  // store of the blocks whose states are there (job/state_placement.h).
  if (o.offload_param().device() == v1::OFFLOAD_DEVICE_NVME) {
    if (o.offload_optimizer().device() != v1::OFFLOAD_DEVICE_NVME) {
      c.Add("offload.offload_param.device",
            "nvme needs offload_optimizer.device nvme: only a block whose fp32 master weights and "
            "Adam states are in the store keeps its 16-bit weights there");
    } else if (!o.offload_param().nvme_path().empty() &&
               o.offload_param().nvme_path() != o.offload_optimizer().nvme_path()) {
      c.Add("offload.offload_param.nvme_path",
            "'" + o.offload_param().nvme_path() +
                "' differs from offload_optimizer.nvme_path: the weights live in the optimizer's "
                "store (leave it unset or give the same directory)");
    }
  }
  for (const auto& [target, name] : {std::pair{&o.offload_optimizer(), "offload.offload_optimizer.pin_memory"},
                                     std::pair{&o.offload_param(), "offload.offload_param.pin_memory"}}) {
    if (target->has_pin_memory() && !target->pin_memory()) {
      c.Add(name, "false is not built: every copy between host and GPU is staged through pinned memory (the "
                  "arena is page-locked once); remove it or set true");
    }
  }
  if (o.offload_optimizer().has_ratio()) {
    const double r = o.offload_optimizer().ratio();
    if (!(r >= 0.0 && r <= 1.0)) {
      c.Add("offload.offload_optimizer.ratio", "must be in [0, 1] (the share of the optimizer states kept off the GPU), got " +
                                                   std::to_string(r));
    } else if (o.offload_optimizer().device() == v1::OFFLOAD_DEVICE_NONE) {
      c.Add("offload.offload_optimizer.ratio", "set with device none, which keeps every state on the GPU; use device cpu or nvme");
    }
  }
  if (o.aio().block_size() % 4096 != 0) c.Add("offload.aio.block_size", "must be a multiple of 4096 for O_DIRECT");
  c.Range<uint64_t>("offload.aio.block_size", o.aio().block_size(), 4096, 64ull << 20);
  c.Range<uint64_t>("offload.aio.queue_depth", o.aio().queue_depth(), 1, 4096);
}

// output_dir/checkpoint-<step> directories, newest first (names only; nothing is opened).
std::vector<std::pair<int64_t, std::string>> CheckpointDirsIn(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  StatusOr<OwnedFd> fd = OpenConfined(dir, O_RDONLY | O_DIRECTORY, Access::kRead);
  if (!fd.ok()) return out;
  const int raw = fd->release();
  DIR* d = fdopendir(raw);
  if (d == nullptr) {
    ::close(raw);
    return out;
  }
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("checkpoint-", 0) != 0 || name.size() == 11 || name.size() > 30) continue;
    if (name.find_first_not_of("0123456789", 11) != std::string::npos) continue;
    struct stat st {};
    if (::fstatat(dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
      out.emplace_back(std::stoll(name.substr(11)), name);
  }
  closedir(d);
  std::sort(out.rbegin(), out.rend());
  return out;
}

// An output_dir that already holds checkpoints, as Hugging Face's TrainingArguments read it:
// refused unless resume_from_checkpoint continues from one of them (`latest` picks the newest,
// resolved here) or overwrite_output_dir starts over (the job then removes them before its first
// step). Without this the job was accepted and failed once started. `out` is resolved.
void CheckOutputCheckpoints(const std::string& out, v1::JobSpec* spec, Checker& c) {
  const auto dirs = CheckpointDirsIn(out);
  const bool latest = spec->resume_from_checkpoint() == "latest";
  if (latest) {
    if (dirs.empty()) {
      c.Add("resume_from_checkpoint", "'latest': output_dir '" + out + "' holds no checkpoint-<step> directory");
      return;
    }
    if (spec->overwrite_output_dir()) {
      c.Add("overwrite_output_dir", "true removes the checkpoints resume_from_checkpoint: latest continues from");
      return;
    }
    spec->set_resume_from_checkpoint(out + "/" + dirs.front().second);
    return;
  }
  if (dirs.empty() || spec->overwrite_output_dir() || !spec->resume_from_checkpoint().empty()) return;
  c.Add("output_dir", "'" + out + "' already holds " + std::to_string(dirs.size()) + " checkpoint(s) (newest " +
                          dirs.front().second + ") of another run: set resume_from_checkpoint: latest to "
                          "continue from it, overwrite_output_dir: true to remove them and start over, or "
                          "choose another output_dir");
}

void CheckCompression(const v1::CompressionConfig& comp, Checker& c) {
  if (comp.type() != v1::COMPRESSION_TYPE_LSP) return;
  c.Range("compression.subspace_rank", comp.subspace_rank(), 1, 65536);
  c.Range("compression.sparsity", comp.sparsity(), 1, comp.subspace_rank() > 0 ? comp.subspace_rank() : 1);
  c.Range("compression.projector_update_interval", comp.projector_update_interval(), 1, 1 << 30);
}

}  // namespace

JobDefaults JobDefaultsOf(const NodeBudget& node) {
  JobDefaults d;
  d.has_gpu = !node.gpus.empty();  // a node with GPUs trains on them
  d.aio_block_size = node.aio_block_size;
  d.aio_queue_depth = node.aio_queue_depth;
  d.host_memory_limit = node.host_memory_limit;
  d.gpu_memory_limit = node.gpu_memory_limit;
  return d;
}

namespace {

// Host RAM and disk as the trainer plans them (job/host_memory.h, the same functions): the
// limit is the job's resources.host_memory_limit, else the node's default (DefaultHostMemoryLimit:
// the daemon's memory.host_memory_limit or what the node can give safely now), which
// offloadd-train applies too.
void CheckHostMemoryAndDisk(const v1::JobSpec& spec, const engine::ModelConfig& config, int compute_bytes,
                            bool gpu, const NodeBudget& node, Checker& c, ValidationResult* r) {
  const auto& res = spec.resources();
  // A job's own limit first, else the node's default.
  trainer::NodeMemory mem = node.host_memory;
  if (mem.total == 0) mem.total = node.host_memory_bytes;
  mem.pinned = gpu;
  const trainer::HostMemoryLimit node_default = trainer::DefaultHostMemoryLimit(
      ResolveJobDefaults(spec, JobDefaultsOf(node)).host_memory_limit, mem);
  const trainer::HostMemoryLimit node_can = trainer::DefaultHostMemoryLimit(0, mem);
  const uint64_t host_limit = node_default.bytes;
  if (res.host_memory_limit() > node.host_memory_bytes) {
    c.Add("resources.host_memory_limit", FormatByteSize(res.host_memory_limit()) + " is more than this node's " +
                                             FormatByteSize(node.host_memory_bytes) + " of RAM");
  }
  trainer::HostMemoryInputs in =
      JobHostMemoryInputs(spec, config, r->model_size, compute_bytes, gpu);
  if (in.optimizer.tier == trainer::StateTier::kNvme && !node.store_dirs.empty()) {
    // As the trainer places them (job/state_placement.h): with a named limit, or a disk too
    // small for every block, RAM holds as many blocks' states as the limit allows, NVMe the rest.
    uint64_t free_bytes = 0;
    for (const auto& d : node.store_dirs) free_bytes += d.available_bytes;
    if (res.host_memory_limit() > 0 || trainer::PredictHostMemory(in).disk_bytes > free_bytes) {
      auto placed = trainer::PlaceStatesUnderLimit(&in, host_limit, free_bytes);
      if (!placed.ok())
        c.Add("offload.offload_optimizer.device", std::string(placed.status().message()));
    } else {
      (void)trainer::PlaceWeightsOnNvme(&in, host_limit);  // offload_param: nvme
    }
  }
  r->host_memory = trainer::PredictHostMemory(in);
  r->host_memory_limit = host_limit;
  uint64_t store_free = 0;  // the node's disk for the capacity figures, whatever the tier
  for (const auto& d : node.store_dirs) store_free += d.available_bytes;
  r->capacity_text = trainer::JobCapacity(in, host_limit, store_free).Describe();
  {
    trainer::HostMemoryInputs t = in;
    t.optimizer.tier = trainer::StateTier::kCpu;
    r->ram_tier_host_bytes = trainer::PredictHostMemory(t).total;
    t.optimizer.tier = trainer::StateTier::kNvme;
    const trainer::HostMemoryPrediction q = trainer::PredictHostMemory(t);
    r->nvme_tier_host_bytes = q.total;
    r->nvme_tier_disk_bytes = q.disk_bytes;
  }
  const std::string source =
      res.host_memory_limit() ? "resources.host_memory_limit" : node_default.source;
  trainer::HostMemoryNames names;
  names.limit = "resources.host_memory_limit";
  names.nvme = "offload.offload_optimizer.device: nvme";
  names.batch = "training.per_device_train_batch_size";
  names.param_nvme = "offload.offload_param.device: nvme";
  names.nvme_configured = !node.store_dirs.empty();
  // Across hosts `in` is one host's share (JobHostMemoryInputs); the NVMe tier is not built there.
  const std::string share =
      res.hosts() > 1 ? "each of the job's " + std::to_string(res.hosts()) + " hosts holds its 1/" +
                            std::to_string(res.hosts()) +
                            " of the optimizer states and the whole weights its ranks read: "
                      : "";
  if (res.hosts() > 1) names.nvme.clear();
  const Status host = trainer::CheckHostMemory(in, host_limit, source, node_can.bytes, names);
  if (!host.ok()) {
    c.Add(res.host_memory_limit() ? "resources.host_memory_limit"
                                  : "offload.offload_optimizer.device",
          share + std::string(host.message()));
  }
  if (r->host_memory.disk_bytes > 0 && !node.store_dirs.empty()) {
    uint64_t free_bytes = 0;
    for (const auto& d : node.store_dirs) free_bytes += d.available_bytes;
    if (free_bytes < r->host_memory.disk_bytes) {
      c.Add("offload.offload_optimizer.device",
            "the store directories have " + FormatByteSize(free_bytes) + " free, below the " +
                FormatByteSize(r->host_memory.disk_bytes) +
                " the optimizer states need there (12 B per parameter and the new versions in flight); "
                "add a store directory (storage.directories) or keep the states in RAM (device cpu)");
    }
  }
}

// model.path: a Hugging Face model directory under the roots whose config.json the engine
// assembles, with the files the job opens; the dropout it trains with. Its config when it read.
std::unique_ptr<engine::ModelConfig> CheckModel(v1::JobSpec& spec, const PathPolicy& paths,
                                                Checker& c, ValidationResult* r) {
  if (!v1::DropoutMode_IsValid(spec.dropout())) {
    c.Add("dropout", "unknown value " + std::to_string(spec.dropout()) + " (expected disable)");
  }
  std::unique_ptr<engine::ModelConfig> config;
  if (spec.model().path().empty()) {
    c.Add("model.path", "required: a Hugging Face model directory (config.json + *.safetensors)");
  } else if (auto dir = paths.ResolveExisting(spec.model().path()); !c.Fails("model.path", dir.status())) {
    spec.mutable_model()->set_path(*dir);
    if (!IsDirectory(*dir)) {
      c.Add("model.path", "'" + *dir + "' is not a directory");
    } else if (auto mc = engine::LoadModelConfig(*dir); !c.Fails("model.path", mc.status())) {
      config = std::make_unique<engine::ModelConfig>(*mc);
      r->model_type = mc->model_type;
      r->model_architecture = mc->architecture;
      r->model_parts = engine::DescribeParts(*mc);
      if (v1::DropoutMode_IsValid(spec.dropout())) {
        c.Fails("dropout", engine::DropoutProblem(*mc, spec.dropout() == v1::DROPOUT_MODE_DISABLE));
      }
      if (!Exists(*dir + "/model.safetensors") && !Exists(*dir + "/model.safetensors.index.json")) {
        c.Add("model.path", *dir + " has neither model.safetensors nor model.safetensors.index.json");
      }
      // Every file the job will open there, as it will open it.
      for (const std::string& problem : ModelFileProblems(*dir)) c.Add("model.path", problem);
    }
  }

  return config;
}

TokenizerCheck CheckTokenizer(v1::JobSpec& spec, const PathPolicy& paths, Checker& c) {
  TokenizerCheck t;
  std::unique_ptr<text::Tokenizer>& tokenizer = t.tokenizer;
  std::string& tokenizer_dir = t.dir;
  const std::string tok_field = spec.tokenizer().path().empty() ? "model.path" : "tokenizer.path";
  const std::string tok_path = spec.tokenizer().path().empty() ? spec.model().path() : spec.tokenizer().path();
  if (!tok_path.empty()) {
    if (auto real = paths.ResolveExisting(tok_path); !c.Fails(tok_field, real.status())) {
      if (!spec.tokenizer().path().empty()) spec.mutable_tokenizer()->set_path(*real);
      if (!spec.tokenizer().path().empty() && IsDirectory(*real)) {  // the export copies its files
        for (const std::string& problem : ModelFileProblems(*real)) c.Add("tokenizer.path", problem);
      }
      auto tok = IsDirectory(*real) ? text::Tokenizer::FromDirectory(*real) : text::Tokenizer::FromFile(*real);
      if (!c.Fails(tok_field, tok.status().WithContext("tokenizer"))) {
        tokenizer = std::move(*tok);
        tokenizer_dir = IsDirectory(*real) ? *real : real->substr(0, real->rfind('/'));
      }
    }
  }

  return t;
}

// dataset.template: "builtin", a template file, or the tokenizer directory's (else the built-in
// one). Null when there is no tokenizer or the template does not parse.
std::unique_ptr<text::ChatTemplate> CheckChatTemplate(v1::JobSpec& spec, const PathPolicy& paths,
                                                      const TokenizerCheck& tok, Checker& c) {
  const auto& ds = spec.dataset();
  const std::unique_ptr<text::Tokenizer>& tokenizer = tok.tokenizer;
  const std::string& tokenizer_dir = tok.dir;
  std::unique_ptr<text::ChatTemplate> chat;
  if (tokenizer) {
    StatusOr<text::ChatTemplate> t = InvalidArgumentError("unset");
    if (ds.template_() == "builtin") {
      t = text::ChatTemplate::BuiltIn(text::SpecialTokens::Guess(*tokenizer));
    } else if (!ds.template_().empty()) {
      auto real = paths.ResolveExisting(ds.template_());
      struct stat st {};
      if (real.ok() && ::stat(real->c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          static_cast<uint64_t>(st.st_size) > text::kMaxChatTemplateBytes) {
        c.Add("dataset.template",
              "'" + *real + "' is " + FormatByteSize(static_cast<uint64_t>(st.st_size)) +
                  ", more than the " + FormatByteSize(text::kMaxChatTemplateBytes) +
                  " a chat template may have (real ones are a few KiB)");
      } else if (!c.Fails("dataset.template", real.status())) {
        auto source = ReadFile(*real);  // a regular file, never a FIFO
        if (!c.Fails("dataset.template", source.status())) {
          auto tokens = text::SpecialTokens::FromTokenizerConfig(tokenizer_dir + "/tokenizer_config.json");
          t = text::ChatTemplate::FromString(*source, tokens.ok() ? *tokens : text::SpecialTokens::Guess(*tokenizer));
          if (!c.Fails("dataset.template", t.status())) spec.mutable_dataset()->set_template_(*real);
        }
      }
    } else {
      t = text::ChatTemplate::FromDirectory(tokenizer_dir);
      if (!t.ok() && t.status().code() == StatusCode::kNotFound) {
        t = text::ChatTemplate::BuiltIn(text::SpecialTokens::Guess(*tokenizer));
      } else {
        c.Fails("tokenizer.path", t.status().WithContext("chat template"));
      }
    }
    if (t.ok()) chat = std::make_unique<text::ChatTemplate>(std::move(*t));
  }
  return chat;
}

// output_dir (writable under the roots, apart from the model, without another run's
// checkpoints unless this is a retry of the request that created the job) and
// resume_from_checkpoint. True when output_dir resolved.
bool CheckOutput(v1::JobSpec& spec, const PathPolicy& paths, const ValidationOptions& options,
                 bool have_config, Checker& c, ValidationResult* r) {
  bool output_dir_ok = false;
  if (spec.output_dir().empty()) {
    c.Add("output_dir", "required: where checkpoints and the final model are written");
  } else if (auto out = paths.ResolveForWriting(spec.output_dir()); !c.Fails("output_dir", out.status())) {
    spec.set_output_dir(*out);
    if (Exists(*out) && !IsDirectory(*out)) c.Add("output_dir", "'" + *out + "' exists and is not a directory");
    output_dir_ok = true;
    if (!options.retry_of_created_job) CheckOutputCheckpoints(*out, &spec, c);
    if (have_config)
      CheckOutputApartFromModel(*out, spec.model().path(), &r->violations);  // model.path resolved
  }
  if (!spec.resume_from_checkpoint().empty() && spec.resume_from_checkpoint() != "latest") {
    if (auto ck = paths.ResolveExisting(spec.resume_from_checkpoint()); !c.Fails("resume_from_checkpoint", ck.status())) {
      spec.set_resume_from_checkpoint(*ck);
      // An offloadd checkpoint (its state parses and its files are all there); a Hugging Face
      // Trainer's is refused here with advice. The crc32c of the tensor data is checked as it is read.
      if (auto reader = trainer::CheckpointReader::Open(*ck); !reader.ok()) {
        c.Add("resume_from_checkpoint", SafeMessageText(std::string(reader.status().message()), 1024));
      }
    }
  }

  return output_dir_ok;
}

}  // namespace

ValidationResult ValidateJobSpec(const v1::JobSpec& input, const PathPolicy& paths,
                                 const NodeBudget& node, const ValidationOptions& options) {
  ValidationResult r;
  r.resolved = input;
  v1::JobSpec& spec = r.resolved;
  Checker c(&r.violations);
  CheckSizes(spec, c);
  CheckPathBytes(spec, &r.violations);
  if (!r.violations.empty())
    return r;  // nothing oversized or cut reaches the file system or the parsers
  // One budget for every rendering of this request, whichever record and file it is for; its
  // stop() also ends the reads and the rendering once the client has gone.
  text::jinja::RequestBudget render_budget(options.max_render_steps, options.stop);
  text::jinja::ScopedRequestBudget scoped_budget(&render_budget);
  const auto stopped = [&] {
    if (render_budget.Stopped())
      r.stopped =
          CancelledError("validation stopped: the call was cancelled or passed its deadline");
    return !r.stopped.ok();
  };
  ResolveHfNames(&spec, &r.violations);  // before the defaults: a set value must win over them
  const bool seq_len_given = spec.dataset().has_max_seq_length();  // here, or as TRL's max_length
  const ResolvedJob resolved = ResolveJobDefaults(spec, JobDefaultsOf(node));
  spec = resolved.spec;
  if (!v1::Speculation_IsValid(spec.offload().speculation())) {
    c.Add("offload.speculation", "unknown value " + std::to_string(spec.offload().speculation()) +
                                     " (expected auto, never or always)");
  }
  const std::unique_ptr<engine::ModelConfig> config = CheckModel(spec, paths, c, &r);
  if (stopped()) return r;
  const TokenizerCheck tok = CheckTokenizer(spec, paths, c);
  const auto& ds = spec.dataset();
  if (ds.paths().empty() && ds.datasets().empty())
    c.Add("dataset.paths", "required: at least one data file (or dataset.datasets, a mixture)");
  c.Range("dataset.max_seq_length", ds.max_seq_length(), 8, 1 << 20);
  // The longest sequence the model trains as transformers does (GPT-2's learned positions, dynamic
  // RoPE), known here so that nothing is refused after a step. Sliding windows are implemented.
  // Left unset, the default (1024) gives way to a model with fewer positions (stories260K: 512).
  if (config && !seq_len_given && PositionsLimit(*config) > 0 &&
      ds.max_seq_length() > PositionsLimit(*config))
    spec.mutable_dataset()->set_max_seq_length(static_cast<int32_t>(PositionsLimit(*config)));
  if (config && !c.Fails("dataset.max_seq_length",
                         engine::SequenceLengthProblem(*config, ds.max_seq_length())))
    c.Fails("dataset.max_seq_length", PositionsProblem(*config, ds.max_seq_length()));
  const std::unique_ptr<text::ChatTemplate> chat = CheckChatTemplate(spec, paths, tok, c);
  CheckMixture(spec, paths, c);
  CheckDatasets(spec, paths, tok, chat.get(), config.get(), options, &render_budget, c, &r);
  if (stopped()) return r;
  if (ds.has_eval_split()) {
    c.Range("dataset.eval_split", ds.eval_split(), 0.0, 0.5, /*lo_open=*/true);  // NaN too
    if (ds.eval_paths_size() > 0) {
      c.Add("dataset.eval_split",
            "given with dataset.eval_paths: hold records out, or name them, not both");
    }
  }
  if (ds.eval_paths_size() == 0 && !ds.has_eval_split() && spec.training().has_eval_steps()) {
    c.Add("training.eval_steps",
          "given without dataset.eval_paths or dataset.eval_split (the held-out records to "
          "evaluate)");
  } else if (ds.eval_paths_size() > 0 || ds.has_eval_split()) {
    c.Range<int64_t>("training.eval_steps", spec.training().eval_steps(), 1, int64_t{1} << 40);
  }

  if (config) {
    for (const auto& [layer, mode] : spec.offload().activations().layer_overrides()) {
      if (layer < 0 || layer >= config->num_layers) {
        c.Add("offload.activations.layer_overrides[" + std::to_string(layer) + "]",
              "the model has " + std::to_string(config->num_layers) + " layers (0 to " +
                  std::to_string(config->num_layers - 1) + ")");
      }
    }
  }
  CheckEnums(spec, c);
  c.Range<int64_t>("dataset.max_samples", ds.max_samples(), 0, int64_t{1} << 40);
  CheckTrainingValues(spec.training(), &r.violations);
  CheckOffload(spec.offload(), node, paths, c);
  CheckCompression(spec.compression(), c);
  for (FieldViolation& v : UnsupportedOptions(spec)) c.Add(v.field, v.description);
  if (spec.offload().offload_param().device() == v1::OFFLOAD_DEVICE_NVME &&
      spec.model().compute_dtype() == v1::COMPUTE_DTYPE_UNSPECIFIED && node.gpus.empty()) {
    c.Add("offload.offload_param.device",
          "nvme needs 16-bit compute, and on this node without a GPU model.compute_dtype resolves "
          "to fp32; set it to bf16 or fp16, or use cpu");
  }
  if (spec.optimizer().master_dtype() == v1::MASTER_DTYPE_BF16 &&
      spec.model().compute_dtype() == v1::COMPUTE_DTYPE_UNSPECIFIED && node.gpus.empty()) {
    c.Add("optimizer.master_dtype",
          "bf16 needs bf16 compute, and on this node without a GPU model.compute_dtype resolves "
          "to fp32; set it to bf16, or use an fp32 master");
  }

  const bool output_dir_ok = CheckOutput(spec, paths, options, config != nullptr, c, &r);
  CheckResources(spec, node, c);
  if (config) {
    CheckGpuMemory(spec, *config, node, resolved.gpu_memory_limit, c, &r);
    const int compute_bytes = ComputeBytes(spec, !node.gpus.empty());
    CheckHostMemoryAndDisk(spec, *config, compute_bytes, !node.gpus.empty(), node, c, &r);
    PriceStep(spec, *config, node, &r);  // with the NVMe blocks the host check placed
    // Room for a checkpoint and the exported model (checked again when the job starts).
    if (output_dir_ok) {
      const Status space =
          CheckOutputSpace(spec.output_dir(), EstimateOutputSpace(r.model_size.total_params, spec.model().path()));
      if (!space.ok()) c.Add("output_dir", space.message());
    }
  }
  return r;
}

}  // namespace offloadd::daemon
