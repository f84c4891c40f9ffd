#include "job/unsupported_options.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

namespace {
std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

std::vector<FieldViolation> UnsupportedOptions(const v1::JobSpec& s) {
  // Every setting of the spec acts on its own. What remains are combinations the trainer refuses
  // when it sets up (trainer_setup.cc, trainer_parallel.cc): listed here so that CreateJob refuses
  // them with the field path instead of the job failing once started. LSP
  // compression's one node-dependent limit (the compute dtype on a GPU) is checked by the
  // validator.
  std::vector<FieldViolation> out;
  const bool lsp = s.compression().type() == v1::COMPRESSION_TYPE_LSP;
  const v1::OffloadTarget& opt = s.offload().offload_optimizer();
  const bool nvme_states = opt.device() == v1::OFFLOAD_DEVICE_NVME;
  const bool auto_batch = s.training().auto_find_batch_size();
  // The data-parallel group: resources.gpus on one host, hosts x gpus_per_host across hosts.
  const auto& res = s.resources();
  const bool across_hosts = res.hosts() > 1;
  const int64_t ranks =
      across_hosts ? int64_t{res.hosts()} * std::max<int64_t>(1, res.gpus_per_host()) : res.gpus();
  const std::string group =
      across_hosts ? "resources.hosts " + std::to_string(res.hosts()) + " x gpus_per_host " +
                         std::to_string(std::max<int64_t>(1, res.gpus_per_host())) +
                         " (data parallelism across hosts)"
                   : "resources.gpus " + std::to_string(ranks) + " (data parallelism)";
  // Compact optimizer modes (docs/optimizer-modes.md): the trainer runs bf16 and int8 states and
  // a bf16 master in the RAM arena, on the NVMe tier and on the GPU, compact states with several
  // ranks of one host in RAM; what it does not run yet is refused.
  const v1::StateDtype state = s.optimizer().state_dtype();
  const bool compact_states = state != v1::STATE_DTYPE_UNSPECIFIED &&
                              state != v1::STATE_DTYPE_FP32 && v1::StateDtype_IsValid(state);
  const bool bf16_master = s.optimizer().master_dtype() == v1::MASTER_DTYPE_BF16;
  if (compact_states || bf16_master) {
    const std::string name =
        compact_states ? "optimizer.state_dtype " +
                             Lower(v1::StateDtype_Name(state).substr(sizeof("STATE_DTYPE_") - 1))
                       : std::string("optimizer.master_dtype bf16");
    if (nvme_states && ranks > 1 && !across_hosts) {  // across hosts NVMe is refused anyway
      out.push_back({"offload.offload_optimizer.device",
                     "nvme with " + name + " and " + group + " is not built yet; use cpu"});
    }
    if (lsp) {
      out.push_back({"compression.type",
                     "lsp is not supported with " + name + " (LSP keeps fp32 subspace states)"});
    }
    // Ranks of one host share rank 0's arena, whose workers step the compact states; the other
    // ranks read its weights, but a GPU replica of a block would start from fp32 states.
    if (ranks > 1 && !across_hosts && opt.has_ratio()) {  // across hosts: CheckHosts refuses it
      out.push_back({"offload.offload_optimizer.ratio",
                     "optimizer states on the GPU with " + name + " and " + group +
                         " are not built yet (each rank's replica starts from fp32 states)"});
    }
  }
  if (s.offload().offload_param().device() == v1::OFFLOAD_DEVICE_NVME) {
    // The 16-bit weights on NVMe (trainer_setup.cc CheckParamTier; the optimizer's store is
    // checked with the offload settings).
    const std::string what = "nvme (the 16-bit weights on NVMe)";
    if (s.model().compute_dtype() == v1::COMPUTE_DTYPE_FP32) {
      out.push_back({"offload.offload_param.device",
                     what + " needs 16-bit compute: with model.compute_dtype fp32 the device reads "
                            "the fp32 masters (use bf16 or fp16, or offload_param.device cpu)"});
    }
    if (ranks > 1) {
      out.push_back(
          {"offload.offload_param.device", what + " with " + group + " is not built yet; use cpu"});
    }
    if (lsp) {
      out.push_back({"offload.offload_param.device",
                     what + " with compression.type lsp is not built (LSP keeps its weights in "
                            "RAM); use cpu"});
    }
  }
  // A bf16 master is the device's bf16 weights (an unset compute_dtype on a node without a GPU
  // resolves to fp32: the validator checks that).
  const v1::ComputeDtype compute = s.model().compute_dtype();
  if (bf16_master && (compute == v1::COMPUTE_DTYPE_FP32 || compute == v1::COMPUTE_DTYPE_FP16)) {
    out.push_back({"optimizer.master_dtype",
                   "bf16 needs model.compute_dtype bf16, not " +
                       std::string(compute == v1::COMPUTE_DTYPE_FP32 ? "fp32" : "fp16") +
                       ": the bf16 master is the device's bf16 weights (or use an fp32 master)"});
  }
  if (lsp && nvme_states) {
    out.push_back(
        {"offload.offload_optimizer.device",
         "nvme is not supported with compression.type lsp: LSP keeps its subspace states in RAM "
         "(use cpu)"});
  }
  if (lsp && opt.has_ratio()) {
    out.push_back(
        {"offload.offload_optimizer.ratio",
         "is not supported with compression.type lsp: LSP updates every subspace on the CPU"});
  }
  if (lsp && auto_batch) {
    out.push_back(
        {"training.per_device_train_batch_size",
         "auto does not price LSP compression yet (compression.type lsp); give the micro-batch"});
  }
  if (ranks > 1) {
    if (lsp && !across_hosts) {  // across hosts: the validator's CheckHosts refuses it
      out.push_back(
          {"resources.gpus", group + " with compression.type lsp is not built yet; use one GPU"});
    }
    if (auto_batch && across_hosts) {  // one host's ranks agree on rank 0's choice
      out.push_back({"training.per_device_train_batch_size",
                     "auto with " + group +
                         " is not built yet (its pricing covers the ranks of one host); give the "
                         "micro-batch per rank"});
    }
    if (nvme_states && opt.has_ratio() && !across_hosts) {  // across hosts: CheckHosts
      out.push_back(
          {"offload.offload_optimizer.ratio",
           "optimizer states on the GPU with the NVMe tier and " + group + " is not built yet"});
    }
    bool nvme_activations = s.offload().activations().mode() == v1::ACTIVATION_MODE_OFFLOAD_NVME;
    for (const auto& [layer, mode] : s.offload().activations().layer_overrides()) {
      nvme_activations |= mode == v1::ACTIVATION_MODE_OFFLOAD_NVME;
    }
    if (nvme_activations) {
      out.push_back({"offload.activations", "offload_nvme with " + group + " is not built yet"});
    }
  }
  return out;
}

}  // namespace offloadd::daemon
