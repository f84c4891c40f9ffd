// `offloadd-optim-tool train --spec=DIR/spec.json`: a few optimizer steps of a layered model
// through a real WorkerPool and StepDriver, with gradients fed in backward order (last layer
// first) and micro-batch accumulation, from files a Python reference test writes:
//   spec.json  {"layers": [n0, n1, ...], "steps": S, "micro_batches": M, "lr": [S values],
//               "beta1", "beta2", "eps", "weight_decay", "max_grad_norm", "processes", "threads",
//               "kernel_path"}
//   init/L<l>.bin            fp32 initial weights
//   grads/s<s>_m<m>_L<l>.bin bf16 gradients of micro-batch m of step s (1-based steps)
// Writes out/L<l>.{master,exp_avg,exp_avg_sq,weights}.bin and out/result.json
// ({"steps": [{"grad_norm": ..., "clip_coef": ...}, ...]}).
#include "workers/tools/train.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ipc/arena.h"
#include "ipc/shm_segment.h"
#include "workers/shard_layout.h"
#include "workers/step_driver.h"
#include "workers/worker_pool.h"

namespace offloadd::workers {
namespace {

namespace fs = std::filesystem;

Status ReadInto(const fs::path& path, void* dst, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot open " + path.string());
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
  if (static_cast<size_t>(in.gcount()) != bytes) {
    return InvalidArgumentError(path.string() + " is shorter than " + std::to_string(bytes) +
                                " bytes");
  }
  return OkStatus();
}

Status WriteFrom(const fs::path& path, const void* src, size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(src), static_cast<std::streamsize>(bytes));
  return out ? OkStatus() : InternalError("cannot write " + path.string());
}

}  // namespace

Status RunTrainSpec(const std::string& spec_path) {
  const fs::path dir = fs::path(spec_path).parent_path();
  nlohmann::json spec;
  try {
    std::ifstream in(spec_path);
    if (!in) return NotFoundError("cannot open " + spec_path);
    spec = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return InvalidArgumentError(spec_path + ": " + e.what());
  }
  std::vector<uint64_t> layers;
  uint32_t steps = 0, micro = 1;
  std::vector<double> lrs;
  OptimizerConfig cfg;
  WorkerPoolOptions po;
  try {
    layers = spec.at("layers").get<std::vector<uint64_t>>();
    steps = spec.at("steps").get<uint32_t>();
    micro = spec.value("micro_batches", 1u);
    lrs = spec.at("lr").get<std::vector<double>>();
    cfg.beta1 = spec.at("beta1");
    cfg.beta2 = spec.at("beta2");
    cfg.eps = spec.at("eps");
    cfg.weight_decay = spec.at("weight_decay");
    cfg.max_grad_norm = spec.value("max_grad_norm", 0.0);
    cfg.accumulation_steps = micro;
    cfg.timeout_ms = 120000;
    po.processes = spec.value("processes", 1u);
    po.threads_per_process = spec.value("threads", 1u);
    po.kernel_path = spec.value("kernel_path", std::string("auto"));
  } catch (const std::exception& e) {
    return InvalidArgumentError(spec_path + ": " + e.what());
  }
  if (lrs.size() != steps) return InvalidArgumentError("spec: lr needs one value per step");
  po.worker_binary =
      (fs::read_symlink("/proc/self/exe").parent_path() / "offloadd-worker").string();

  const ShardLayoutOptions layout{.accumulation_steps = micro};
  ASSIGN_OR_RETURN(
      ipc::SharedSegment segment,
      ipc::SharedSegment::Create(ArenaBytesFor(layers, layout, po), {.name = "train"}));
  ASSIGN_OR_RETURN(
      ipc::Arena arena,
      ipc::Arena::Format(&segment, {.max_regions = RegionsFor(layers, layout, po.processes)}));
  ASSIGN_OR_RETURN(std::vector<ShardSpec> shards,
                   AllocateShards(&arena, layers, layout, po.processes));
  for (size_t l = 0; l < layers.size(); ++l) {
    RETURN_IF_ERROR(ReadInto(dir / "init" / ("L" + std::to_string(l) + ".bin"),
                             arena.At<void>(shards[l].master_offset), layers[l] * 4));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<WorkerPool> pool, WorkerPool::Start(&segment, &arena, po));
  StepDriver driver(pool.get(), shards, cfg);
  nlohmann::json result;
  result["steps"] = nlohmann::json::array();
  for (uint32_t step = 1; step <= steps; ++step) {
    RETURN_IF_ERROR(driver.BeginStep(step, lrs[step - 1]));
    for (uint32_t m = 0; m < micro; ++m) {
      for (size_t l = layers.size(); l-- > 0;) {   // backward: last layer first
        RETURN_IF_ERROR(driver.WaitShardIdle(l));  // its staging buffer is about to be reused
        const std::string name = "s" + std::to_string(step) + "_m" + std::to_string(m) + "_L" +
                                 std::to_string(l) + ".bin";
        RETURN_IF_ERROR(
            ReadInto(dir / "grads" / name, arena.At<void>(shards[l].grad_offset), layers[l] * 2));
        RETURN_IF_ERROR(driver.GradsReady(l, m));
      }
    }
    ASSIGN_OR_RETURN(StepResult r, driver.FinishStep());
    result["steps"].push_back({{"grad_norm", r.grad_norm},
                               {"clip_coef", r.clip_coef},
                               {"params_updated", r.params_updated}});
  }
  RETURN_IF_ERROR(pool->Shutdown());
  const WorkerPoolMetrics metrics = pool->Metrics();
  result["kernel_path"] = metrics.kernel_path;
  result["restarts"] = metrics.restarts_total;
  fs::create_directories(dir / "out");
  for (size_t l = 0; l < layers.size(); ++l) {
    const std::string p = "L" + std::to_string(l) + ".";
    const uint64_t n = layers[l];
    RETURN_IF_ERROR(WriteFrom(dir / "out" / (p + "master.bin"),
                              arena.At<void>(shards[l].master_offset), n * 4));
    RETURN_IF_ERROR(WriteFrom(dir / "out" / (p + "exp_avg.bin"),
                              arena.At<void>(shards[l].exp_avg_offset), n * 4));
    RETURN_IF_ERROR(WriteFrom(dir / "out" / (p + "exp_avg_sq.bin"),
                              arena.At<void>(shards[l].exp_avg_sq_offset), n * 4));
    RETURN_IF_ERROR(WriteFrom(dir / "out" / (p + "weights.bin"),
                              arena.At<void>(shards[l].weights_offset), n * 2));
  }
  std::ofstream(dir / "out" / "result.json") << result.dump(2) << "\n";
  std::cout << result.dump() << "\n";
  return OkStatus();
}

}  // namespace offloadd::workers
