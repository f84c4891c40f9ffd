// offloadd-train: runs the offloaded training pipeline for one job from flags, outside the daemon
// (benchmarks, parity tests, debugging). Prints one line per step; --stats-jsonl writes every
// StepStats as JSON; --dump-batches writes the token ids of the first steps.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/units.h"
#include "trainer/batch_planner.h"
#include "trainer/data_source.h"
#include "trainer/lsp_mode.h"
#include "trainer/tools/rank_launcher.h"
#include "trainer/trainer.h"

namespace offloadd::trainer {
namespace {

const char kUsage[] = R"(usage: offloadd-train --model=DIR (--data=FILE ... | --synthetic-seq=N) [options]
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
               auto on a GPU, never on the CPU; never is the bitwise-reproducible choice)
               --compression=none|lsp[:rank=S,nonzeros=D,check_every=N,threshold=T,learn_steps=K,
                 learn_lr=LR,gamma=G,projectors=learned|identity] (LSP-Offload, CPU device; lsp/README.md)
               --tier=cpu|nvme --nvme-dir=DIR (repeat) --nvme-block-size=SIZE (the store's aio.block_size)
               --host-memory-limit=SIZE (default: 80% of RAM, as the daemon's; a job over it is refused)
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
               (one rank of a group started elsewhere) --parallel-timeout=SECONDS (600)
  binaries:    --worker-binary=PATH --store-binary=PATH (default: next to this program)
)";

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

std::string SelfPath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n <= 0 ? std::string("offloadd-train") : std::string(buf, static_cast<size_t>(n));
}

std::string FindBinary(const std::string& name, const std::string& component) {
  const std::string dir = SelfDir();
  for (const std::string& c : {dir + "/" + name, dir + "/../" + component + "/" + name}) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return dir + "/" + name;
}

// std::sto* with the whole value consumed: "4x" or "1e-3abc" is a bad value, not 4 or 1e-3, and an
// unsigned flag refuses a sign (std::stoull("-1") wraps around). Throws like std::sto* (the flag
// loop turns it into "bad value").
template <typename T, typename F>
T Whole(const std::string& s, F parse, bool is_unsigned = false) {
  if (is_unsigned && s.find('-') != std::string::npos) throw std::invalid_argument(s);
  size_t pos = 0;
  const T v = parse(s, &pos);
  if (pos != s.size()) throw std::invalid_argument(s);
  return v;
}
int StrictStoi(const std::string& s) { return Whole<int>(s, [](const std::string& x, size_t* p) { return std::stoi(x, p); }); }
long long StrictStoll(const std::string& s) {
  return Whole<long long>(s, [](const std::string& x, size_t* p) { return std::stoll(x, p); });
}
unsigned long StrictStoul(const std::string& s) {
  return Whole<unsigned long>(s, [](const std::string& x, size_t* p) { return std::stoul(x, p); }, true);
}
unsigned long long StrictStoull(const std::string& s) {
  return Whole<unsigned long long>(s, [](const std::string& x, size_t* p) { return std::stoull(x, p); }, true);
}
double StrictStod(const std::string& s) { return Whole<double>(s, [](const std::string& x, size_t* p) { return std::stod(x, p); }); }

StatusOr<ActivationMode> ParseMode(const std::string& s) {
  if (s == "auto") return ActivationMode::kAuto;
  if (s == "keep") return ActivationMode::kKeep;
  if (s == "recompute") return ActivationMode::kRecompute;
  if (s == "offload" || s == "offload_cpu") return ActivationMode::kOffloadCpu;
  if (s == "offload_nvme") return ActivationMode::kOffloadNvme;
  if (s == "recompute_offload_cpu") return ActivationMode::kRecomputeOffloadCpu;
  return InvalidArgumentError(
      "activation mode must be auto, keep, recompute, recompute_offload_cpu, offload_cpu or offload_nvme, got '" + s +
      "'");
}

class PrintObserver : public TrainObserver {
 public:
  PrintObserver(std::ofstream* jsonl, int rank) : jsonl_(rank == 0 ? jsonl : nullptr), rank_(rank) {}
  void OnStep(const StepStats& s) override {
    if (rank_ != 0) return;
    std::printf("step %lld/%lld loss %.6f lr %.3e grad_norm %.4f  %.3fs  %.0f tok/s  %.1f TFLOP/s"
                "  (gpu %.3fs h2d %.3fs d2h %.3fs cpu %.3fs nvme %.3fs; stalls w %.3fs g %.3fs o %.3fs)",
                static_cast<long long>(s.step), static_cast<long long>(s.max_steps), s.loss,
                s.learning_rate, s.grad_norm, s.step_seconds,
                s.step_seconds > 0 ? s.tokens / s.step_seconds : 0.0,
                s.step_seconds > 0 ? s.model_flops / s.step_seconds / 1e12 : 0.0,
                s.gpu_compute_seconds, s.h2d_seconds, s.d2h_seconds, s.cpu_update_seconds,
                s.nvme_seconds, s.stall_weights_seconds, s.stall_grads_seconds,
                s.stall_optimizer_seconds);
    if (s.speculated_layers > 0) {
      std::printf("  speculated %d%s", s.speculated_layers,
                  s.corrected_layers > 0 ? (" corrected " + std::to_string(s.corrected_layers)).c_str()
                                         : "");
    }
    if (s.loss_scale != 1 || s.skipped) {  // fp16
      std::printf("  loss_scale %g%s", s.loss_scale, s.skipped ? " OVERFLOW: step skipped" : "");
    }
    std::printf("\n");
    std::fflush(stdout);
    if (jsonl_ != nullptr) {
      nlohmann::json j = {{"step", s.step}, {"max_steps", s.max_steps}, {"epoch", s.epoch},
                          {"tokens", s.tokens}, {"trained_tokens", s.trained_tokens},
                          {"loss", s.loss}, {"aux_loss", s.aux_loss},
                          {"learning_rate", s.learning_rate},
                          {"grad_norm", s.grad_norm}, {"loss_scale", s.loss_scale},
                          {"skipped", s.skipped}, {"clipped", s.clipped},
                          {"speculated_layers", s.speculated_layers},
                          {"cpu_update_params", s.cpu_update_params},
                          {"device_update_params", s.device_update_params},
                          {"corrected_layers", s.corrected_layers}, {"step_seconds", s.step_seconds},
                          {"model_flops", s.model_flops},
                          {"gpu_compute_seconds", s.gpu_compute_seconds},
                          {"gpu_forward_seconds", s.gpu_forward_seconds},
                          {"h2d_seconds", s.h2d_seconds}, {"d2h_seconds", s.d2h_seconds},
                          {"cpu_update_seconds", s.cpu_update_seconds},
                          {"nvme_seconds", s.nvme_seconds},
                          {"lsp_compress_seconds", s.lsp_compress_seconds},
                          {"lsp_decompress_seconds", s.lsp_decompress_seconds},
                          {"stall_weights_seconds", s.stall_weights_seconds},
                          {"stall_grads_seconds", s.stall_grads_seconds},
                          {"stall_optimizer_seconds", s.stall_optimizer_seconds},
                          {"stall_activations_seconds", s.stall_activations_seconds},
                          {"nvme_activation_bytes", s.nvme_activation_bytes},
                          {"h2d_bytes", s.h2d_bytes}, {"d2h_bytes", s.d2h_bytes},
                          {"nvme_read_bytes", s.nvme_read_bytes},
                          {"nvme_write_bytes", s.nvme_write_bytes},
                          {"gpu_peak_bytes", s.gpu_peak_bytes}};
      if (!s.setup_phase_seconds.empty()) {  // the run's first step
        j["time_to_first_step_seconds"] = s.time_to_first_step_seconds;
        for (size_t i = 0; i < s.setup_phase_seconds.size() && i < kSetupPhases.size(); ++i) {
          j["setup_" + std::string(kSetupPhases[i]) + "_seconds"] = s.setup_phase_seconds[i];
          if (i < s.setup_phase_start_seconds.size()) {
            j["setup_" + std::string(kSetupPhases[i]) + "_start_seconds"] = s.setup_phase_start_seconds[i];
          }
        }
      }
      *jsonl_ << j.dump() << "\n";
      jsonl_->flush();
    }
  }
  void OnProjectorCheck(const ProjectorCheckStats& c) override {
    if (jsonl_ != nullptr) {  // its own record, full precision (the log line rounds)
      nlohmann::json j = {{"step", c.step}, {"lsp_checked", c.checked}, {"lsp_switched", c.switched},
                          {"lsp_mean_bias", c.mean_bias}, {"lsp_mean_bias_after", c.mean_bias_after},
                          {"lsp_check_seconds", c.seconds}};
      *jsonl_ << j.dump() << "\n";
      jsonl_->flush();
    }
  }

  void OnEval(const EvalStats& e) override {
    std::printf("eval step %lld loss %.6f tokens %lld  %.3fs\n", static_cast<long long>(e.step), e.loss,
                static_cast<long long>(e.tokens), e.seconds);
    std::fflush(stdout);
    if (jsonl_ != nullptr) {  // its own record: no "loss" key, so step records stay alike
      nlohmann::json j = {{"step", e.step}, {"eval_loss", e.loss}, {"eval_tokens", e.tokens},
                          {"eval_seconds", e.seconds}};
      *jsonl_ << j.dump() << "\n";
      jsonl_->flush();
    }
  }
  void OnLog(Level level, const std::string& message) override {
    if (rank_ != 0 && (level == Level::kDebug || level == Level::kInfo)) return;
    std::fprintf(stderr, "%s%s: %s\n", rank_ == 0 ? "" : ("[rank " + std::to_string(rank_) + "] ").c_str(),
                 level == Level::kWarning ? "warning" : "info", message.c_str());
  }

 private:
  std::ofstream* jsonl_;
  int rank_ = 0;
};

Status DumpBatches(const TrainConfig& c, const std::string& path, int64_t steps) {
  // A second source with the same configuration yields the same stream the trainer consumes.
  ASSIGN_OR_RETURN(auto probe, DataSource::Create(c.data, c.model_dir, 1 << 30, c.batch_size, c.seed));
  nlohmann::json out = nlohmann::json::array();
  for (int64_t s = 0; s < steps; ++s) {
    nlohmann::json step = nlohmann::json::array();
    for (int a = 0; a < c.gradient_accumulation_steps; ++a) {
      ASSIGN_OR_RETURN(MicroBatchData m, probe->Next());
      step.push_back({{"batch", m.batch}, {"seq", m.seq}, {"input_ids", m.input_ids},
                      {"targets", m.targets}, {"position_ids", m.position_ids},
                      {"segment_ids", m.segment_ids}});
    }
    out.push_back(step);
  }
  std::ofstream f(path);
  f << out.dump();
  if (!f) return InternalError("writing " + path + " failed");
  return OkStatus();
}

int Run(int argc, char** argv) {
  TrainConfig c;
  std::string stats_path, dump_path;
  std::vector<std::string> eval_paths;
  int gpus = 0;
  std::vector<std::string> rank_args;  // --gpus=N: the arguments every rank gets
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key != "--gpus" && key != "--control-fd") rank_args.push_back(arg);
    auto size = [&](uint64_t* out) -> Status {
      ASSIGN_OR_RETURN(*out, ParseByteSize(v));
      return OkStatus();
    };
    Status st;
    try {
      if (key == "--model") c.model_dir = v;
      else if (key == "--random-init") c.random_init = true;
      else if (key == "--dropout") {
        if (v != "model" && v != "disable") st = InvalidArgumentError("--dropout: model or disable");
        c.dropout_disabled = v == "disable";
      }
      else if (key == "--tokenizer") c.data.tokenizer_path = v;
      else if (key == "--data") c.data.paths.push_back(v);
      else if (key == "--eval-data") eval_paths.push_back(v);
      else if (key == "--eval-steps") c.eval_steps = StrictStoll(v);
      else if (key == "--format") c.data.format = v;
      else if (key == "--max-seq-length") c.data.max_seq_length = StrictStoi(v);
      else if (key == "--packing") c.data.packing = true;
      else if (key == "--no-shuffle") c.data.shuffle = false;
      else if (key == "--max-samples") c.data.max_samples = StrictStoll(v);
      else if (key == "--synthetic-seq") c.data.synthetic_seq_length = StrictStoi(v);
      else if (key == "--chat-template") c.data.chat_template = v;
      else if (key == "--device") c.device = v;
      else if (key == "--dtype") c.compute_dtype = v;
      else if (key == "--gpu-memory-limit") st = size(&c.offload.gpu_memory_limit);
      else if (key == "--host-memory-limit") st = size(&c.offload.host_memory_limit);
      else if (key == "--activations") {
        auto m = ParseMode(v);
        st = m.status();
        if (m.ok()) c.offload.activations = *m;
      } else if (key == "--layer-activation") {
        const size_t colon = v.find(':');
        auto m = ParseMode(colon == std::string::npos ? "" : v.substr(colon + 1));
        st = m.status();
        if (m.ok()) c.offload.layer_overrides[StrictStoi(v.substr(0, colon))] = *m;
      } else if (key == "--lr") c.optim.learning_rate = StrictStod(v);
      else if (key == "--scheduler") c.optim.lr_scheduler_type = v;
      else if (key == "--warmup-steps") c.optim.warmup_steps = StrictStoll(v);
      else if (key == "--warmup-ratio") c.optim.warmup_ratio = StrictStod(v);
      else if (key == "--num-cycles") c.optim.num_cycles = StrictStod(v);
      else if (key == "--min-lr-rate") c.optim.min_lr_rate = StrictStod(v);
      else if (key == "--weight-decay") c.optim.weight_decay = StrictStod(v);
      else if (key == "--beta1") c.optim.beta1 = StrictStod(v);
      else if (key == "--beta2") c.optim.beta2 = StrictStod(v);
      else if (key == "--eps") c.optim.eps = StrictStod(v);
      else if (key == "--max-grad-norm") c.optim.max_grad_norm = StrictStod(v);
      else if (key == "--speculate") c.optim.speculation = v;
      else if (key == "--setup-threads") c.setup_threads = static_cast<uint32_t>(StrictStoi(v));
      else if (key == "--no-setup-overlap") c.setup_overlap = false;
      else if (key == "--host-weight-copy") c.offload.host_weight_copy = true;
      else if (key == "--validate-only") c.validate_only = true;
      else if (key == "--length-buckets") {
        if (v != "on" && v != "off") st = InvalidArgumentError("--length-buckets: on or off");
        c.data.length_buckets = v == "on";
      }
      else if (key == "--compression") st = ParseLspSpec(v, &c.lsp);
      else if (key == "--init-scale") c.loss_scale.init_scale = StrictStod(v);
      else if (key == "--growth-factor") c.loss_scale.growth_factor = StrictStod(v);
      else if (key == "--backoff-factor") c.loss_scale.backoff_factor = StrictStod(v);
      else if (key == "--growth-interval") c.loss_scale.growth_interval = StrictStoll(v);
      else if (key == "--weights") {
        using W = OffloadPlanConfig::Weights;
        if (v == "auto") c.offload.weights = W::kAuto;
        else if (v == "resident") c.offload.weights = W::kResident;
        else if (v == "stream") c.offload.weights = W::kStreamed;
        else st = InvalidArgumentError("--weights: auto, resident or stream");
      } else if (key == "--tier") {
        if (v != "cpu" && v != "nvme") st = InvalidArgumentError("--tier: cpu or nvme");
        c.offload.tier = v == "nvme" ? StateTier::kNvme : StateTier::kCpu;
      } else if (key == "--nvme-dir") c.offload.nvme_dirs.push_back(v);
      else if (key == "--workers") {
        const size_t x = v.find('x');
        c.worker_processes = static_cast<uint32_t>(StrictStoul(v.substr(0, x)));
        if (x != std::string::npos) c.worker_threads = static_cast<uint32_t>(StrictStoul(v.substr(x + 1)));
      } else if (key == "--adamw-kernel") c.adamw_kernel = v;
      else if (key == "--transition-layer") c.offload.transition_layer = StrictStoi(v);
      else if (key == "--update-depth") {
        const int d = StrictStoi(v);
        if (d < 1 || d > 64) st = InvalidArgumentError("--update-depth: 1..64 updates queued per worker, got " + v);
        c.offload.update_depth = static_cast<uint32_t>(d);
      } else if (key == "--device-optimizer-blocks") {
        if (v == "auto") {
          c.offload.device_optimizer_blocks = OffloadPlanConfig::kAutoDeviceOptimizer;
        } else {
          const int d = StrictStoi(v);
          if (d < 0) st = InvalidArgumentError("--device-optimizer-blocks: a block count >= 0 or auto, got " + v);
          c.offload.device_optimizer_blocks = d;
        }
      }
      else if (key == "--batch-size") {
        // auto: the fastest micro-batch up to 64; auto:N up to N (trainer/batch_planner.h).
        if (v.rfind("auto", 0) == 0) {
          c.auto_batch_size = true;
          c.batch_size = v == "auto" ? kDefaultAutoBatchCap : v.rfind("auto:", 0) == 0 ? StrictStoi(v.substr(5)) : 0;
          if (c.batch_size < 1) st = InvalidArgumentError("--batch-size: N, auto or auto:N (N >= 1), got " + v);
        } else {
          c.batch_size = StrictStoi(v);
        }
      }
      else if (key == "--train-batch-size") c.global_batch_size = StrictStoi(v);
      else if (key == "--grad-accum") c.gradient_accumulation_steps = StrictStoi(v);
      else if (key == "--epochs") c.num_train_epochs = StrictStod(v);
      else if (key == "--max-steps") c.max_steps = StrictStoll(v);
      else if (key == "--seed") c.seed = StrictStoull(v);
      else if (key == "--output-dir") c.output_dir = v;
      else if (key == "--save-steps") c.save_steps = StrictStoll(v);
      else if (key == "--save-total-limit") c.save_total_limit = StrictStoll(v);
      else if (key == "--resume-from") c.resume_from = v;
      else if (key == "--no-export") c.export_final_model = false;
      else if (key == "--trace") c.trace_path = v;
      else if (key == "--profile-dir") c.profile_dir = v;
      else if (key == "--trace-steps") c.trace_steps = StrictStoll(v);
      else if (key == "--stats-jsonl") stats_path = v;
      else if (key == "--dump-batches") dump_path = v;
      else if (key == "--worker-binary") c.worker_binary = v;
      else if (key == "--store-binary") c.store_binary = v;
      else if (key == "--gpus") gpus = StrictStoi(v);
      else if (key == "--nvme-block-size") {
        uint64_t b = 0;
        st = size(&b);
        if (st.ok() && (b == 0 || b % 4096 != 0 || b > (64u << 20))) {
          st = InvalidArgumentError("--nvme-block-size: a multiple of 4096 up to 64MiB, got " + v);
        }
        c.offload.nvme_block_size = static_cast<uint32_t>(b);
      }
      else if (key == "--rank") c.parallel.rank = StrictStoi(v);
      else if (key == "--world-size") c.parallel.world_size = StrictStoi(v);
      else if (key == "--rendezvous") c.parallel.rendezvous = v;
      else if (key == "--parallel-timeout") c.parallel.timeout_seconds = StrictStoll(v);
      else if (key == "--control-fd") close(StrictStoi(v));  // the rank launcher's channel: unused
      else st = InvalidArgumentError("unknown flag " + key + " (see --help)");
    } catch (const std::exception&) {
      st = InvalidArgumentError(key + ": bad value '" + v + "'");
    }
    if (!st.ok()) {
      std::cerr << "offloadd-train: " << st.ToString() << "\n";
      return 2;
    }
  }
  if (!eval_paths.empty()) {  // read like the training data, in order, every record
    c.eval_data = c.data;
    c.eval_data.paths = eval_paths;
    c.eval_data.max_samples = 0;
    c.eval_data.synthetic_seq_length = 0;
  }
  if (c.model_dir.empty()) {
    std::cerr << "offloadd-train: --model is required\n" << kUsage;
    return 2;
  }
  if (gpus < 0 || (gpus > 1 && c.parallel.world_size > 1)) {
    std::cerr << "offloadd-train: --gpus is a rank count >= 1, and not given with --world-size\n";
    return 2;
  }
  if (gpus > 1) {
    if (c.device.rfind("cuda:", 0) == 0) {
      std::cerr << "offloadd-train: --gpus gives each rank its own GPU; use --device=cuda (and CUDA_VISIBLE_DEVICES)\n";
      return 2;
    }
    return RunRanks(SelfPath(), rank_args, gpus, c.device == "cuda");
  }
  if (c.worker_binary.empty()) c.worker_binary = FindBinary("offloadd-worker", "workers");
  if (c.store_binary.empty()) c.store_binary = FindBinary("offloadd-store", "storage");
  std::ofstream stats;
  if (!stats_path.empty()) {
    stats.open(stats_path);
    if (!stats) {
      std::cerr << "offloadd-train: cannot write " << stats_path << "\n";
      return 1;
    }
  }
  // Data parallel: rank 0 reports the steps; the other ranks only their warnings.
  PrintObserver obs(stats_path.empty() ? nullptr : &stats, c.parallel.rank);
  auto trainer = Trainer::Create(c, &obs);
  if (!trainer.ok()) {
    std::cerr << "offloadd-train: " << trainer.status().ToString() << "\n";
    return 1;
  }
  if (c.validate_only) {  // the plan is made and priced; nothing is trained
    const StepPrediction& p = (*trainer)->prediction();
    if (c.parallel.rank == 0) {
      std::printf("valid: %s\n", p.text.c_str());
      nlohmann::json j = {{"predicted_step_seconds", p.step_seconds},
                          {"predicted_tokens_per_second", p.tokens_per_second},
                          {"micro_batch", p.micro}, {"accumulation", p.accumulation}, {"seq", p.seq},
                          {"bound", p.bound}, {"basis", p.basis},
                          {"predicted_host_bytes", p.host_bytes}, {"predicted_disk_bytes", p.disk_bytes},
                          {"host_memory_limit", p.host_limit},
                          {"tiers", {{"ram", {{"host_bytes", p.ram_tier_host_bytes}, {"disk_bytes", 0}}},
                                     {"nvme", {{"host_bytes", p.nvme_tier_host_bytes},
                                               {"disk_bytes", p.nvme_tier_disk_bytes},
                                               {"disk_seconds", p.nvme_tier_disk_seconds}}}}}};
      std::printf("%s\n", j.dump().c_str());
      std::printf("host memory: %s\n", p.host_text.c_str());
      std::printf("per tier of the optimizer states: RAM: host %s, disk 0; NVMe: host %s, disk %s%s\n",
                  FormatByteSize(p.ram_tier_host_bytes).c_str(), FormatByteSize(p.nvme_tier_host_bytes).c_str(),
                  FormatByteSize(p.nvme_tier_disk_bytes).c_str(),
                  p.nvme_tier_disk_seconds > 0
                      ? (", the disk's share of a step at least " + std::to_string(p.nvme_tier_disk_seconds) + " s")
                            .c_str()
                      : "");
    }
    return 0;
  }
  if (!dump_path.empty()) {
    TrainConfig chosen = c;  // the automatic batch size's choice
    chosen.batch_size = (*trainer)->batch_size();
    chosen.gradient_accumulation_steps = (*trainer)->gradient_accumulation_steps();
    if (!chosen.data.length_buckets) chosen.data.length_buckets = c.device != "cpu";  // as the trainer resolves it
    Status st = DumpBatches(chosen, dump_path, (*trainer)->total_steps());
    if (!st.ok()) {
      std::cerr << "offloadd-train: " << st.ToString() << "\n";
      return 1;
    }
  }
  auto r = (*trainer)->Train();
  if (!r.ok()) {
    std::cerr << "offloadd-train: " << r.status().ToString() << "\n";
    return 1;
  }
  if (c.parallel.rank == 0) std::printf("done: %lld steps, final loss %.6f%s%s\n", static_cast<long long>(r->steps),
              r->final_loss, r->exported_to.empty() ? "" : ", model in ",
              r->exported_to.c_str());
  return 0;
}

}  // namespace
}  // namespace offloadd::trainer

int main(int argc, char** argv) { return offloadd::trainer::Run(argc, argv); }
