// offloadd-sizing: the memory the job validator asks of a model, from its config.json alone
// (job/memory_estimate.h, train_job_config.h's EstimateOutputSpace), for the README's
// sizing table (scripts/sizing_table.py) and for sizing a machine before a model is downloaded.
//
//   offloadd-sizing --batch=B --seq=S [--compute-bytes=2|4] DIR...
//
// Prints one JSON object per DIR (one line each): total_params; gpu_floor_bytes (streaming every
// block, recomputing activations) with its breakdown; host_bytes_cpu (the host RAM the validator
// predicts and checks against the host limit with offload_optimizer.device cpu: arena and
// processes, job/host_memory.h) and host_bytes_nvme (device nvme); nvme_bytes (the store's
// disk with the states on NVMe); checkpoint_bytes (one checkpoint's states).
// Exit 1 with the reason when a config is refused, 2 on bad flags.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/model_config.h"
#include "job/host_memory.h"
#include "job/memory_estimate.h"
#include "job/train_job_config.h"

namespace {

bool ParseInt(const std::string& arg, const std::string& flag, int64_t* out) {
  if (arg.rfind(flag + "=", 0) != 0) return false;
  char* end = nullptr;
  const std::string v = arg.substr(flag.size() + 1);
  const long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n <= 0) {
    std::fprintf(stderr, "offloadd-sizing: %s needs a positive integer, not '%s'\n", flag.c_str(), v.c_str());
    std::exit(2);
  }
  *out = n;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 0, seq = 0, compute_bytes = 2;
  std::vector<std::string> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (ParseInt(a, "--batch", &batch) || ParseInt(a, "--seq", &seq) || ParseInt(a, "--compute-bytes", &compute_bytes)) {
      continue;
    }
    if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "offloadd-sizing: unknown flag %s\nusage: offloadd-sizing --batch=B --seq=S "
                           "[--compute-bytes=2|4] DIR...\n", a.c_str());
      return 2;
    }
    dirs.push_back(a);
  }
  if (batch == 0 || seq == 0 || dirs.empty() || (compute_bytes != 2 && compute_bytes != 4)) {
    std::fprintf(stderr, "usage: offloadd-sizing --batch=B --seq=S [--compute-bytes=2|4] DIR...\n");
    return 2;
  }
  for (const std::string& dir : dirs) {
    auto config = offloadd::engine::LoadModelConfig(dir);
    if (!config.ok()) {
      std::fprintf(stderr, "offloadd-sizing: %s: %s\n", dir.c_str(), std::string(config.status().message()).c_str());
      return 1;
    }
    const auto size = offloadd::daemon::EstimateModelSize(*config);
    const auto f = offloadd::daemon::EstimateMemoryFloor(size, *config, batch, seq, static_cast<int>(compute_bytes));
    const auto out = offloadd::daemon::EstimateOutputSpace(size.total_params, dir);
    // The host RAM and disk the validator predicts (JobHostMemoryInputs -> the trainer's
    // PredictHostMemory) with the optimizer states in RAM and on NVMe, on a GPU node.
    offloadd::v1::JobSpec spec;
    spec.mutable_training()->set_per_device_train_batch_size(static_cast<int32_t>(batch));
    if (compute_bytes == 4)
      spec.mutable_model()->set_compute_dtype(offloadd::v1::COMPUTE_DTYPE_FP32);
    offloadd::trainer::HostMemoryInputs in = offloadd::daemon::JobHostMemoryInputs(
        spec, *config, size, static_cast<int>(compute_bytes), true);
    in.optimizer.tier = offloadd::trainer::StateTier::kCpu;
    const offloadd::trainer::HostMemoryPrediction ram = offloadd::trainer::PredictHostMemory(in);
    in.optimizer.tier = offloadd::trainer::StateTier::kNvme;
    const offloadd::trainer::HostMemoryPrediction nvme = offloadd::trainer::PredictHostMemory(in);
    nlohmann::json j = {{"dir", dir},
                        {"model_type", config->model_type},
                        {"total_params", size.total_params},
                        {"batch", batch},
                        {"seq", seq},
                        {"compute_bytes", compute_bytes},
                        {"gpu_floor_bytes", f.gpu_bytes},
                        {"gpu_breakdown", f.gpu_breakdown},
                        {"host_bytes_cpu", ram.total},
                        {"host_bytes_nvme", nvme.total},
                        {"nvme_bytes", nvme.disk_bytes},
                        {"checkpoint_bytes", out.checkpoint_bytes}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}
