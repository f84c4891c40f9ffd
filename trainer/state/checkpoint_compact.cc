// Checkpoints of the compact optimizer modes (trainer/state/checkpoint.h, docs/optimizer-modes.md):
// a layer's states in their own format, as U8 tensors "exp_avg" and "exp_avg_sq" holding the
// workers' state regions byte for byte (and a bf16 master's region as U8 "master"), with the
// mode in the file's metadata.
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/file.h"
#include "engine/safetensors.h"
#include "trainer/state/checkpoint.h"
#include "trainer/state/checkpoint_state.h"

namespace offloadd::trainer {

using checkpoint_internal::Bytes;
using checkpoint_internal::HeaderEntry;
using checkpoint_internal::LayerFile;
using checkpoint_internal::SafetensorsPrefix;
using checkpoint_internal::WriteSyncedFile;

Status CheckpointWriter::WriteCompactStates(int layer, const LayerState& state) {
  const bool bf16_master = state.master_dtype == "bf16";  // WriteLayer checked the region
  const std::vector<int64_t> m_shape = {static_cast<int64_t>(state.exp_avg_region.size())};
  const std::vector<int64_t> v_shape = {static_cast<int64_t>(state.exp_avg_sq_region.size())};
  const std::vector<int64_t> w_shape = {static_cast<int64_t>(state.master_region.size())};
  std::vector<HeaderEntry> tensors = {{"exp_avg", &m_shape, "U8", 1},
                                      {"exp_avg_sq", &v_shape, "U8", 1}};
  if (bf16_master) tensors.push_back({"master", &w_shape, "U8", 1});
  const std::string prefix =
      SafetensorsPrefix(tensors, {{"format", "pt"},
                                  {"layer", std::to_string(layer)},
                                  {"adam_step", std::to_string(state.adam_step)},
                                  {"state_dtype", state.state_dtype},
                                  {"master_dtype", state.master_dtype}});
  const std::string name = LayerFile("optimizer", layer);
  ASSIGN_OR_RETURN(crcs_[name], WriteSyncedFile(lock_fd_, name, JoinPath(tmp_dir_, name),
                                                {Bytes(prefix), std::as_bytes(state.exp_avg_region),
                                                 std::as_bytes(state.exp_avg_sq_region),
                                                 std::as_bytes(state.master_region)}));
  files_[name] = prefix.size() + state.exp_avg_region.size() + state.exp_avg_sq_region.size() +
                 state.master_region.size();
  return OkStatus();
}

StatusOr<int64_t> CheckpointReader::ReadCompactStates(int layer, const LayerTarget& target) const {
  const std::string name = LayerFile("optimizer", layer);
  RETURN_IF_ERROR(VerifyFile(name));
  ASSIGN_OR_RETURN(auto file, engine::SafetensorsFile::Open(JoinPath(dir_, name)));
  const auto& meta = file->metadata();
  const auto dtype = meta.find("state_dtype");
  const std::string have = dtype == meta.end() ? "fp32" : dtype->second;
  if (have != target.state_dtype) {
    return FailedPreconditionError(file->path() + ": holds " + have +
                                   " optimizer states, this "
                                   "run's are " +
                                   target.state_dtype);
  }
  // Files written before the bf16 master existed have no "master_dtype": an fp32 master.
  const auto master = meta.find("master_dtype");
  const std::string have_master = master == meta.end() ? "fp32" : master->second;
  if (have_master != target.master_dtype) {
    return FailedPreconditionError(file->path() + ": holds a " + have_master +
                                   " master, this run's is " + target.master_dtype);
  }
  std::vector<std::pair<const char*, std::span<uint8_t>>> regions = {
      {"exp_avg", target.exp_avg_region}, {"exp_avg_sq", target.exp_avg_sq_region}};
  if (target.master_dtype == "bf16") regions.push_back({"master", target.master_region});
  for (const auto& [tensor, dst] : regions) {
    const engine::TensorInfo* t = file->Find(tensor);
    if (t == nullptr || t->dtype != engine::DType::kU8 || file->data(*t).size() != dst.size()) {
      const std::string what = std::string(tensor) == "master"
                                   ? "bf16 master region"
                                   : target.state_dtype + " state region";
      return DataLossError(file->path() + ": tensor \"" + tensor + "\" is missing or not " +
                           std::to_string(dst.size()) + " bytes of U8 (the layer's " + what + ")");
    }
    std::memcpy(dst.data(), file->data(*t).data(), dst.size());
  }
  const auto step = meta.find("adam_step");
  const std::string text = step == meta.end() ? "" : step->second;
  char* end = nullptr;
  const long long adam_step = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || adam_step < 0 || *end != '\0') {
    return DataLossError(file->path() + ": metadata \"adam_step\" is missing or not a count");
  }
  return static_cast<int64_t>(adam_step);
}

}  // namespace offloadd::trainer
