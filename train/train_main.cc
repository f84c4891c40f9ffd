// offloadd-train: runs the offloaded training pipeline for one job outside the daemon (benchmarks,
// parity tests, debugging): a job file read as the daemon reads it, or flags alone, the flags
// overriding the job file (train_args.h). Prints one line per step; --stats-jsonl writes every
// StepStats as JSON; --dump-batches writes the token ids of the first steps.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/units.h"
#include "job/batch_planner.h"
#include "train/job_file_config.h"
#include "train/rank_launcher.h"
#include "train/torchrun_env.h"
#include "train/train_args.h"
#include "trainer/data_source.h"
#include "trainer/trainer.h"

namespace offloadd::trainer {
namespace {

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
      nlohmann::json j = {{"step", s.step},
                          {"max_steps", s.max_steps},
                          {"epoch", s.epoch},
                          {"tokens", s.tokens},
                          {"trained_tokens", s.trained_tokens},
                          {"loss", s.loss},
                          {"aux_loss", s.aux_loss},
                          {"learning_rate", s.learning_rate},
                          {"grad_norm", s.grad_norm},
                          {"loss_scale", s.loss_scale},
                          {"skipped", s.skipped},
                          {"clipped", s.clipped},
                          {"speculated_layers", s.speculated_layers},
                          {"cpu_update_params", s.cpu_update_params},
                          {"device_update_params", s.device_update_params},
                          {"corrected_layers", s.corrected_layers},
                          {"step_seconds", s.step_seconds},
                          {"model_flops", s.model_flops},
                          {"gpu_compute_seconds", s.gpu_compute_seconds},
                          {"gpu_forward_seconds", s.gpu_forward_seconds},
                          {"h2d_seconds", s.h2d_seconds},
                          {"d2h_seconds", s.d2h_seconds},
                          {"cpu_update_seconds", s.cpu_update_seconds},
                          {"nvme_seconds", s.nvme_seconds},
                          {"lsp_compress_seconds", s.lsp_compress_seconds},
                          {"lsp_decompress_seconds", s.lsp_decompress_seconds},
                          {"stall_weights_seconds", s.stall_weights_seconds},
                          {"stall_grads_seconds", s.stall_grads_seconds},
                          {"stall_optimizer_seconds", s.stall_optimizer_seconds},
                          {"stall_activations_seconds", s.stall_activations_seconds},
                          {"nvme_activation_bytes", s.nvme_activation_bytes},
                          {"h2d_bytes", s.h2d_bytes},
                          {"d2h_bytes", s.d2h_bytes},
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

// The run's configuration: the job file's (or the defaults) with the flags applied over it.
StatusOr<TrainArgs> MakeArgs(int argc, char** argv) {
  ASSIGN_OR_RETURN(ParsedCommandLine parsed, ParseCommandLine(argc, argv));
  TrainArgs& args = parsed.args;
  if (args.help) return std::move(args);
  if (!args.job_file.empty()) {
    const JobFileBinaries binaries{FindBinary("offloadd-worker", "workers"),
                                   FindBinary("offloadd-store", "storage")};
    ASSIGN_OR_RETURN(args.config, TrainConfigFromJobFile(args.job_file, args.sets, binaries));
  } else if (!args.sets.empty()) {
    return InvalidArgumentError("--set overrides a job file's fields: name the job file first");
  }
  RETURN_IF_ERROR(ApplyOverrides(parsed.overrides, &args));
  // torchrun, srun or a PyTorchJob started this process as one rank of a group.
  ASSIGN_OR_RETURN(const std::optional<TorchrunEnv> torchrun,
                   ReadTorchrunEnv([](const char* name) { return std::getenv(name); }));
  if (torchrun) RETURN_IF_ERROR(ApplyTorchrunEnv(*torchrun, args.gpus, &args.config));
  return std::move(args);
}

void PrintPrediction(const StepPrediction& p) {
  std::printf("valid: %s\n", p.text.c_str());
  nlohmann::json j = {{"predicted_step_seconds", p.step_seconds},
                      {"predicted_tokens_per_second", p.tokens_per_second},
                      {"micro_batch", p.micro},
                      {"accumulation", p.accumulation},
                      {"seq", p.seq},
                      {"bound", p.bound},
                      {"basis", p.basis},
                      {"predicted_host_bytes", p.host_bytes},
                      {"predicted_disk_bytes", p.disk_bytes},
                      {"host_memory_limit", p.host_limit},
                      {"tiers",
                       {{"ram", {{"host_bytes", p.ram_tier_host_bytes}, {"disk_bytes", 0}}},
                        {"nvme",
                         {{"host_bytes", p.nvme_tier_host_bytes},
                          {"disk_bytes", p.nvme_tier_disk_bytes},
                          {"disk_seconds", p.nvme_tier_disk_seconds}}}}}};
  nlohmann::json lengths = nlohmann::json::array();
  for (const LengthPrediction& l : p.lengths) {
    lengths.push_back({{"seq", l.seq},
                       {"fits", l.fits},
                       {"predicted_gpu_bytes", l.gpu_bytes},
                       {"predicted_step_seconds", l.step_seconds},
                       {"predicted_tokens_per_second", l.tokens_per_second}});
  }
  j["lengths"] = lengths;
  j["predicted_gpu_bytes"] = p.gpu_bytes;
  if (p.moe.moe()) {
    const MoeStepFigures& m = p.moe;
    j["moe"] = {{"num_experts", m.num_experts},
                {"top_k", m.top_k},
                {"sparse_layers", m.sparse_layers},
                {"total_params", m.total_params},
                {"active_params", m.active_params},
                {"expert_params", m.expert_params},
                {"tokens", m.tokens},
                {"routed_experts", m.routed_experts},
                {"expert_rows", m.expert_rows},
                {"expert_upload_bytes", m.expert_upload_bytes},
                {"routed_upload_bytes", m.routed_upload_bytes},
                {"router_flops", m.router_flops},
                {"expert_flops", m.expert_flops},
                {"expert_host_bytes", m.expert_host_bytes}};
  }
  std::printf("%s\n", j.dump().c_str());
  for (const LengthPrediction& l : p.lengths) std::printf("at %s\n", l.text.c_str());
  std::printf("host memory: %s\n", p.host_text.c_str());
  if (!p.moe_text.empty()) std::printf("%s\n", p.moe_text.c_str());
  std::printf("per tier of the optimizer states: RAM: host %s, disk 0; NVMe: host %s, disk %s%s\n",
              FormatByteSize(p.ram_tier_host_bytes).c_str(),
              FormatByteSize(p.nvme_tier_host_bytes).c_str(),
              FormatByteSize(p.nvme_tier_disk_bytes).c_str(),
              p.nvme_tier_disk_seconds > 0 ? (", the disk's share of a step at least " +
                                              std::to_string(p.nvme_tier_disk_seconds) + " s")
                                                 .c_str()
                                           : "");
}

int Run(int argc, char** argv) {
  auto parsed = MakeArgs(argc, argv);
  if (!parsed.ok()) {
    std::cerr << "offloadd-train: " << parsed.status().ToString() << "\n";
    return 2;
  }
  if (parsed->help) {
    std::fputs(kTrainUsage, stdout);
    return 0;
  }
  const TrainArgs& args = *parsed;
  TrainConfig c = args.config;
  const int gpus = args.gpus;
  const std::string& stats_path = args.stats_path;
  const std::string& dump_path = args.dump_path;
  if (c.model_dir.empty()) {
    std::cerr << "offloadd-train: --model is required (or a job file's model.path)\n"
              << kTrainUsage;
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
    return RunRanks(SelfPath(), args.rank_args, gpus, c.device == "cuda");
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
    if (c.parallel.rank == 0) PrintPrediction((*trainer)->prediction());
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
