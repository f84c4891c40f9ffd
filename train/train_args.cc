#include "train/train_args.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <stdexcept>
#include <utility>

#include "common/units.h"
#include "job/batch_planner.h"
#include "trainer/pipeline/lsp_mode.h"

namespace offloadd::trainer {

const char kTrainUsage[] = R"(usage: offloadd-train [JOB_FILE] [--set KEY=VALUE ...] [options]
       offloadd-train --model=DIR (--data=FILE ... | --synthetic-seq=N) [options]
  job file:    JOB_FILE a job spec as offloadctl submits it (YAML or JSON, job.proto's names),
               read and validated as the daemon does; the options below override what it gives
               --set KEY=VALUE (repeat) sets one of its fields by its dotted path, e.g.
               --set training.max_steps=20 --set resources.gpu_memory_limit=24GiB
  model/data:  --model=DIR --random-init --dropout=model|disable --tokenizer=PATH --data=FILE (repeat) --format=F
               --max-seq-length=N --packing --no-shuffle --max-samples=N --synthetic-seq=N
               --chat-template=builtin|FILE
               --eval-data=FILE (repeat; same format) --eval-steps=N (held-out loss every N steps)
  device:      --device=cpu|cuda|cuda:N --dtype=auto|fp32|bf16|fp16 --gpu-memory-limit=SIZE
               --activations=auto|keep|recompute|recompute_offload_cpu|offload_cpu|offload_nvme --layer-activation=I:MODE (repeat)
               --weights=auto|resident|stream
  optimizer:   --lr=X --scheduler=linear|cosine|cosine_with_min_lr|constant|constant_with_warmup
               --warmup-steps=N --warmup-ratio=X --num-cycles=X --min-lr-rate=X --weight-decay=X
               --beta1=X --beta2=X --eps=X --max-grad-norm=X
               --speculate=auto|always|never (updates before the clipping norm is known; default
               auto on a GPU, never on the CPU; never and always are bitwise reproducible)
               --state-dtype=fp32|bf16|int8 (AdamW states; bf16/int8 are not exact,
                 states on the host: docs/optimizer-modes.md) --master-dtype=fp32|bf16 (bf16:
                 with a Kahan compensation, the device's weights; needs --dtype=bf16)
               --compression=none|lsp[:rank=S,nonzeros=D,check_every=N,threshold=T,learn_steps=K,
                 learn_lr=LR,gamma=G,projectors=learned|identity] (LSP-Offload, CPU device; lsp/README.md)
               --tier=cpu|nvme --nvme-dir=DIR (repeat) --nvme-block-size=SIZE (the store's aio.block_size)
               --param-tier=cpu|auto|nvme (--tier=nvme, 16-bit compute: the 16-bit weights of NVMe
                 blocks in RAM, on NVMe where RAM runs short, or on NVMe for every such block)
               --host-memory-limit=SIZE (default: what the node can give now, as the daemon's:
                 MemAvailable less max(4 GiB, 6% of RAM); a job over it is refused with its numbers)
               --host-weight-copy (16-bit compute: keep a 16-bit weight copy in RAM, 16 bytes per
               parameter, instead of casting the fp32 masters on the device, 14)
               --workers=PROCESSESxTHREADS --transition-layer=N --update-depth=N (1..64, default 1)
               --setup-threads=N (populating the arena, reading the weights, pinning; 0: all cores)
               --no-setup-overlap (populate the whole arena before reading the weights)
               --validate-only (stop after the plan: print the predicted step time and tokens/s)
               --length-buckets=on|off (pad records to a few lengths per octave; default on a GPU)
               --device-optimizer-blocks=N|auto (the lowest N blocks' AdamW states on the device
               and updated there; auto (default): the step planner places them after the first
               step, and keeps the top layers' activations where that is faster, from the node
               profile: --profile-dir=DIR caches it, else it is measured every run)
               --adamw-kernel=auto|portable|avx2|avx512|avx512bf16 (auto: $OFFLOADD_ADAMW_KERNEL,
               else the fastest this CPU supports)
  fp16 loss scaling (torch.amp.GradScaler's arguments): --init-scale=X (65536)
               --growth-factor=X (2) --backoff-factor=X (0.5) --growth-interval=N (2000)
  loop:        --batch-size=N|auto|auto:N (auto: the micro-batch up to N, 64, and accumulation the
               planner prices fastest) --train-batch-size=N (sequences per optimizer step: with
               auto, micro x accumulation = N) --grad-accum=N --epochs=X --max-steps=N --seed=N
               --output-dir=DIR --save-steps=N --save-total-limit=N --resume-from=DIR --no-export
  output:      --trace=FILE.json --trace-steps=N --stats-jsonl=FILE --dump-batches=FILE
  parallel:    --gpus=N (data parallel: N ranks of this program, one per GPU; on --device=cpu N CPU
               ranks over Gloo) --rank=R --world-size=N --rendezvous=file:///PATH|tcp://HOST:PORT
               (one rank of a group started elsewhere) --hosts=N (the ranks span N hosts, as
               many on each, numbered host by host: ZeRO-1, each host its slice of the states)
               --parallel-timeout=SECONDS (600)
               or the torchrun environment (torchrun, srun, PyTorchJob): MASTER_ADDR MASTER_PORT
               RANK WORLD_SIZE [LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE]
  binaries:    --worker-binary=PATH --store-binary=PATH (default: next to this program)
)";

namespace {

using Arg = const std::string&;

// std::sto* with the whole value consumed: "4x" or "1e-3abc" is a bad value, not 4 or 1e-3, and an
// unsigned flag refuses a sign (std::stoull("-1") wraps around). Throws like std::sto* (the flag
// table turns it into "bad value").
template <typename T, typename F>
T Whole(const std::string& s, F parse, bool is_unsigned = false) {
  if (is_unsigned && s.find('-') != std::string::npos) throw std::invalid_argument(s);
  size_t pos = 0;
  const T v = parse(s, &pos);
  if (pos != s.size()) throw std::invalid_argument(s);
  return v;
}
int Int(const std::string& s) {
  return Whole<int>(s, [](const std::string& x, size_t* p) { return std::stoi(x, p); });
}
int64_t Int64(const std::string& s) {
  return Whole<long long>(s, [](const std::string& x, size_t* p) { return std::stoll(x, p); });
}
uint32_t Uint32(const std::string& s) {
  return static_cast<uint32_t>(Whole<unsigned long>(
      s, [](const std::string& x, size_t* p) { return std::stoul(x, p); }, true));
}
uint64_t Uint64(const std::string& s) {
  return Whole<unsigned long long>(
      s, [](const std::string& x, size_t* p) { return std::stoull(x, p); }, true);
}
double Real(const std::string& s) {
  return Whole<double>(s, [](const std::string& x, size_t* p) { return std::stod(x, p); });
}

StatusOr<ActivationMode> ParseMode(const std::string& s) {
  if (s == "auto") return ActivationMode::kAuto;
  if (s == "keep") return ActivationMode::kKeep;
  if (s == "recompute") return ActivationMode::kRecompute;
  if (s == "offload" || s == "offload_cpu") return ActivationMode::kOffloadCpu;
  if (s == "offload_nvme") return ActivationMode::kOffloadNvme;
  if (s == "recompute_offload_cpu") return ActivationMode::kRecomputeOffloadCpu;
  return InvalidArgumentError(
      "activation mode must be auto, keep, recompute, recompute_offload_cpu, offload_cpu or "
      "offload_nvme, got '" +
      s + "'");
}

// Registers flags on the CLI11 app; each occurrence becomes a FlagAction, in command-line order
// (trigger_on_parse), applied later on top of the job file's configuration.
class FlagTable {
 public:
  using Apply = std::function<Status(TrainArgs&, const std::string&)>;
  FlagTable(CLI::App* app, std::vector<FlagAction>* out) : app_(app), out_(out) {}

  // A flag with a value. An exception from `apply` (a std::sto* parse) is a bad value.
  void Value(const std::string& name, Apply apply) {
    app_->add_option(name)
        ->each([this, name, apply](const std::string& v) {
          out_->push_back([name, apply, v](TrainArgs& a) -> Status {
            try {
              return apply(a, v);
            } catch (const std::exception&) {
              return InvalidArgumentError(name + ": bad value '" + v + "'");
            }
          });
        })
        ->trigger_on_parse()
        ->take_all();
  }
  // A flag with a value that cannot be wrong but for its number's syntax.
  void Assign(const std::string& name, std::function<void(TrainArgs&, Arg)> assign) {
    Value(name, [assign](TrainArgs& a, Arg v) {
      assign(a, v);
      return OkStatus();
    });
  }
  // A flag without a value.
  void Switch(const std::string& name, std::function<void(TrainArgs&)> apply) {
    app_->add_flag_callback(name,
                            [this, apply] {
                              out_->push_back([apply](TrainArgs& a) {
                                apply(a);
                                return OkStatus();
                              });
                            })
        ->trigger_on_parse();
  }
  // A byte size ("24GiB", "500MB", bytes).
  void Size(const std::string& name, std::function<uint64_t&(TrainConfig&)> field) {
    Value(name, [field](TrainArgs& a, const std::string& v) -> Status {
      ASSIGN_OR_RETURN(field(a.config), ParseByteSize(v));
      return OkStatus();
    });
  }

 private:
  CLI::App* app_;
  std::vector<FlagAction>* out_;
};

void AddModelAndDataFlags(FlagTable& f) {
  f.Assign("--model", [](TrainArgs& a, Arg v) { a.config.model_dir = v; });
  f.Switch("--random-init", [](TrainArgs& a) { a.config.random_init = true; });
  f.Value("--dropout", [](TrainArgs& a, const std::string& v) {
    if (v != "model" && v != "disable") return InvalidArgumentError("--dropout: model or disable");
    a.config.dropout_disabled = v == "disable";
    return OkStatus();
  });
  f.Assign("--tokenizer", [](TrainArgs& a, Arg v) { a.config.data.tokenizer_path = v; });
  f.Assign("--data", [](TrainArgs& a, Arg v) { a.config.data.paths.push_back(v); });
  f.Assign("--eval-data", [](TrainArgs& a, Arg v) { a.eval_paths.push_back(v); });
  f.Assign("--eval-steps", [](TrainArgs& a, Arg v) { a.config.eval_steps = Int64(v); });
  f.Assign("--format", [](TrainArgs& a, Arg v) { a.config.data.format = v; });
  f.Assign("--max-seq-length", [](TrainArgs& a, Arg v) { a.config.data.max_seq_length = Int(v); });
  f.Switch("--packing", [](TrainArgs& a) { a.config.data.packing = true; });
  f.Switch("--no-shuffle", [](TrainArgs& a) { a.config.data.shuffle = false; });
  f.Assign("--max-samples", [](TrainArgs& a, Arg v) { a.config.data.max_samples = Int64(v); });
  f.Assign("--synthetic-seq",
           [](TrainArgs& a, Arg v) { a.config.data.synthetic_seq_length = Int(v); });
  f.Assign("--chat-template", [](TrainArgs& a, Arg v) { a.config.data.chat_template = v; });
  f.Value("--length-buckets", [](TrainArgs& a, const std::string& v) {
    if (v != "on" && v != "off") return InvalidArgumentError("--length-buckets: on or off");
    a.config.data.length_buckets = v == "on";
    return OkStatus();
  });
}

void AddDeviceFlags(FlagTable& f) {
  f.Assign("--device", [](TrainArgs& a, Arg v) { a.config.device = v; });
  f.Assign("--dtype", [](TrainArgs& a, Arg v) { a.config.compute_dtype = v; });
  f.Size("--gpu-memory-limit",
         [](TrainConfig& c) -> uint64_t& { return c.offload.gpu_memory_limit; });
  f.Size("--host-memory-limit",
         [](TrainConfig& c) -> uint64_t& { return c.offload.host_memory_limit; });
  f.Value("--activations", [](TrainArgs& a, const std::string& v) -> Status {
    ASSIGN_OR_RETURN(a.config.offload.activations, ParseMode(v));
    return OkStatus();
  });
  f.Value("--layer-activation", [](TrainArgs& a, const std::string& v) -> Status {
    const size_t colon = v.find(':');
    ASSIGN_OR_RETURN(const ActivationMode m,
                     ParseMode(colon == std::string::npos ? "" : v.substr(colon + 1)));
    a.config.offload.layer_overrides[Int(v.substr(0, colon))] = m;
    return OkStatus();
  });
  f.Value("--weights", [](TrainArgs& a, const std::string& v) {
    using W = OffloadPlanConfig::Weights;
    if (v == "auto")
      a.config.offload.weights = W::kAuto;
    else if (v == "resident")
      a.config.offload.weights = W::kResident;
    else if (v == "stream")
      a.config.offload.weights = W::kStreamed;
    else
      return InvalidArgumentError("--weights: auto, resident or stream");
    return OkStatus();
  });
  f.Switch("--host-weight-copy", [](TrainArgs& a) { a.config.offload.host_weight_copy = true; });
  f.Value("--tier", [](TrainArgs& a, const std::string& v) {
    if (v != "cpu" && v != "nvme") return InvalidArgumentError("--tier: cpu or nvme");
    a.config.offload.tier = v == "nvme" ? StateTier::kNvme : StateTier::kCpu;
    return OkStatus();
  });
  f.Value("--param-tier", [](TrainArgs& a, const std::string& v) {
    using P = OffloadPlanConfig::ParamTier;
    if (v == "cpu")
      a.config.offload.param_tier = P::kCpu;
    else if (v == "auto")
      a.config.offload.param_tier = P::kAuto;
    else if (v == "nvme")
      a.config.offload.param_tier = P::kNvme;
    else
      return InvalidArgumentError("--param-tier: cpu, auto or nvme, got " + v);
    return OkStatus();
  });
  f.Assign("--nvme-dir", [](TrainArgs& a, Arg v) { a.config.offload.nvme_dirs.push_back(v); });
  f.Value("--nvme-block-size", [](TrainArgs& a, const std::string& v) -> Status {
    ASSIGN_OR_RETURN(const uint64_t b, ParseByteSize(v));
    if (b == 0 || b % 4096 != 0 || b > (64u << 20)) {
      return InvalidArgumentError("--nvme-block-size: a multiple of 4096 up to 64MiB, got " + v);
    }
    a.config.offload.nvme_block_size = static_cast<uint32_t>(b);
    return OkStatus();
  });
}

void AddOptimizerFlags(FlagTable& f) {
  using Field = double& (*)(TrainConfig&);
  const std::pair<const char*, Field> reals[] = {
      {"--lr", [](TrainConfig& c) -> double& { return c.optim.learning_rate; }},
      {"--warmup-ratio", [](TrainConfig& c) -> double& { return c.optim.warmup_ratio; }},
      {"--num-cycles", [](TrainConfig& c) -> double& { return c.optim.num_cycles; }},
      {"--min-lr-rate", [](TrainConfig& c) -> double& { return c.optim.min_lr_rate; }},
      {"--weight-decay", [](TrainConfig& c) -> double& { return c.optim.weight_decay; }},
      {"--beta1", [](TrainConfig& c) -> double& { return c.optim.beta1; }},
      {"--beta2", [](TrainConfig& c) -> double& { return c.optim.beta2; }},
      {"--eps", [](TrainConfig& c) -> double& { return c.optim.eps; }},
      {"--max-grad-norm", [](TrainConfig& c) -> double& { return c.optim.max_grad_norm; }},
      {"--init-scale", [](TrainConfig& c) -> double& { return c.loss_scale.init_scale; }},
      {"--growth-factor", [](TrainConfig& c) -> double& { return c.loss_scale.growth_factor; }},
      {"--backoff-factor", [](TrainConfig& c) -> double& { return c.loss_scale.backoff_factor; }},
      {"--epochs", [](TrainConfig& c) -> double& { return c.num_train_epochs; }},
  };
  for (const auto& [name, field] : reals) {
    f.Assign(name, [field](TrainArgs& a, Arg v) { field(a.config) = Real(v); });
  }
  f.Assign("--scheduler", [](TrainArgs& a, Arg v) { a.config.optim.lr_scheduler_type = v; });
  f.Assign("--warmup-steps", [](TrainArgs& a, Arg v) { a.config.optim.warmup_steps = Int64(v); });
  f.Assign("--growth-interval",
           [](TrainArgs& a, Arg v) { a.config.loss_scale.growth_interval = Int64(v); });
  f.Assign("--speculate", [](TrainArgs& a, Arg v) { a.config.optim.speculation = v; });
  f.Assign("--state-dtype", [](TrainArgs& a, Arg v) { a.config.optim.state_dtype = v; });
  f.Assign("--master-dtype", [](TrainArgs& a, Arg v) { a.config.optim.master_dtype = v; });
  f.Value("--compression",
          [](TrainArgs& a, const std::string& v) { return ParseLspSpec(v, &a.config.lsp); });
  f.Assign("--adamw-kernel", [](TrainArgs& a, Arg v) { a.config.adamw_kernel = v; });
  f.Value("--workers", [](TrainArgs& a, const std::string& v) {
    const size_t x = v.find('x');
    a.config.worker_processes = Uint32(v.substr(0, x));
    if (x != std::string::npos) a.config.worker_threads = Uint32(v.substr(x + 1));
    return OkStatus();
  });
  f.Assign("--transition-layer",
           [](TrainArgs& a, Arg v) { a.config.offload.transition_layer = Int(v); });
  f.Value("--update-depth", [](TrainArgs& a, const std::string& v) {
    const int d = Int(v);
    if (d < 1 || d > 64)
      return InvalidArgumentError("--update-depth: 1..64 updates queued per worker, got " + v);
    a.config.offload.update_depth = static_cast<uint32_t>(d);
    return OkStatus();
  });
  f.Value("--device-optimizer-blocks", [](TrainArgs& a, const std::string& v) {
    if (v == "auto") {
      a.config.offload.device_optimizer_blocks = OffloadPlanConfig::kAutoDeviceOptimizer;
      return OkStatus();
    }
    const int d = Int(v);
    if (d < 0)
      return InvalidArgumentError("--device-optimizer-blocks: a block count >= 0 or auto, got " +
                                  v);
    a.config.offload.device_optimizer_blocks = d;
    return OkStatus();
  });
  f.Assign("--setup-threads",
           [](TrainArgs& a, Arg v) { a.config.setup_threads = static_cast<uint32_t>(Int(v)); });
  f.Switch("--no-setup-overlap", [](TrainArgs& a) { a.config.setup_overlap = false; });
  f.Switch("--validate-only", [](TrainArgs& a) { a.config.validate_only = true; });
}

void AddLoopFlags(FlagTable& f) {
  f.Value("--batch-size", [](TrainArgs& a, const std::string& v) {
    TrainConfig& c = a.config;
    // auto: the fastest micro-batch up to 64; auto:N up to N (job/batch_planner.h).
    if (v.rfind("auto", 0) == 0) {
      c.auto_batch_size = true;
      c.batch_size = v == "auto"                ? kDefaultAutoBatchCap
                     : v.rfind("auto:", 0) == 0 ? Int(v.substr(5))
                                                : 0;
      if (c.batch_size < 1)
        return InvalidArgumentError("--batch-size: N, auto or auto:N (N >= 1), got " + v);
    } else {
      c.batch_size = Int(v);
    }
    return OkStatus();
  });
  f.Assign("--train-batch-size", [](TrainArgs& a, Arg v) { a.config.global_batch_size = Int(v); });
  f.Assign("--grad-accum",
           [](TrainArgs& a, Arg v) { a.config.gradient_accumulation_steps = Int(v); });
  f.Assign("--max-steps", [](TrainArgs& a, Arg v) { a.config.max_steps = Int64(v); });
  f.Assign("--seed", [](TrainArgs& a, Arg v) { a.config.seed = Uint64(v); });
  f.Assign("--output-dir", [](TrainArgs& a, Arg v) { a.config.output_dir = v; });
  f.Assign("--save-steps", [](TrainArgs& a, Arg v) { a.config.save_steps = Int64(v); });
  f.Assign("--save-total-limit", [](TrainArgs& a, Arg v) { a.config.save_total_limit = Int64(v); });
  f.Assign("--resume-from", [](TrainArgs& a, Arg v) { a.config.resume_from = v; });
  f.Switch("--no-export", [](TrainArgs& a) { a.config.export_final_model = false; });
}

void AddOutputAndParallelFlags(FlagTable& f) {
  f.Assign("--trace", [](TrainArgs& a, Arg v) { a.config.trace_path = v; });
  f.Assign("--trace-steps", [](TrainArgs& a, Arg v) { a.config.trace_steps = Int64(v); });
  f.Assign("--profile-dir", [](TrainArgs& a, Arg v) { a.config.profile_dir = v; });
  f.Assign("--stats-jsonl", [](TrainArgs& a, Arg v) { a.stats_path = v; });
  f.Assign("--dump-batches", [](TrainArgs& a, Arg v) { a.dump_path = v; });
  f.Assign("--worker-binary", [](TrainArgs& a, Arg v) { a.config.worker_binary = v; });
  f.Assign("--store-binary", [](TrainArgs& a, Arg v) { a.config.store_binary = v; });
  f.Assign("--gpus", [](TrainArgs& a, Arg v) { a.gpus = Int(v); });
  f.Assign("--rank", [](TrainArgs& a, Arg v) { a.config.parallel.rank = Int(v); });
  f.Assign("--world-size", [](TrainArgs& a, Arg v) { a.config.parallel.world_size = Int(v); });
  f.Assign("--rendezvous", [](TrainArgs& a, Arg v) { a.config.parallel.rendezvous = v; });
  f.Assign("--hosts", [](TrainArgs& a, Arg v) { a.config.parallel.hosts = Int(v); });
  f.Assign("--parallel-timeout",
           [](TrainArgs& a, Arg v) { a.config.parallel.timeout_seconds = Int64(v); });
  // The rank launcher's channel: unused by a rank of offloadd-train.
  f.Value("--control-fd", [](TrainArgs&, const std::string& v) {
    close(Int(v));
    return OkStatus();
  });
}

// Every argument but --gpus and --control-fd (and their values when given apart).
std::vector<std::string> RankArgs(int argc, char** argv) {
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string key = arg.substr(0, arg.find('='));
    if (key != "--gpus" && key != "--control-fd") {
      out.push_back(arg);
    } else if (arg == key) {
      ++i;  // "--gpus 2"
    }
  }
  return out;
}

}  // namespace

StatusOr<ParsedCommandLine> ParseCommandLine(int argc, char** argv) {
  ParsedCommandLine parsed;
  TrainArgs& args = parsed.args;
  CLI::App app("offloadd-train", "offloadd-train");
  app.set_help_flag();  // kTrainUsage instead of CLI11's generated text
  app.add_flag("-h,--help", args.help);
  app.allow_extras();  // refused below, naming the flag as before
  app.add_option("job_file", args.job_file);
  app.add_option("--set", args.sets)->take_all();
  FlagTable flags(&app, &parsed.overrides);
  AddModelAndDataFlags(flags);
  AddDeviceFlags(flags);
  AddOptimizerFlags(flags);
  AddLoopFlags(flags);
  AddOutputAndParallelFlags(flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return InvalidArgumentError(e.what());
  }
  for (const std::string& extra : app.remaining()) {
    if (extra.rfind("-", 0) == 0) {
      return InvalidArgumentError("unknown flag " + extra.substr(0, extra.find('=')) +
                                  " (see --help)");
    }
    return InvalidArgumentError("unexpected argument '" + extra +
                                "': one job file at most (see --help)");
  }
  args.rank_args = RankArgs(argc, argv);
  return parsed;
}

Status ApplyOverrides(const std::vector<FlagAction>& overrides, TrainArgs* args) {
  for (const FlagAction& apply : overrides) RETURN_IF_ERROR(apply(*args));
  if (!args->eval_paths.empty()) {  // read like the training data, in order, every record
    TrainConfig& c = args->config;
    c.eval_data = c.data;
    c.eval_data.paths = args->eval_paths;
    c.eval_data.max_samples = 0;
    c.eval_data.synthetic_seq_length = 0;
  }
  return OkStatus();
}

}  // namespace offloadd::trainer
