#include "job/shape_profile.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/file.h"
#include "common/file_identity.h"
#include "common/safe_path.h"
#include "common/units.h"

namespace offloadd::trainer {

std::string ShapeProfileKey(const std::string& gpu, const std::string& model, int64_t batch,
                            int64_t seq, const std::string& dtype) {
  return gpu + " | " + model + " | " + std::to_string(batch) + "x" + std::to_string(seq) + " " +
         dtype;
}

std::string ShapeProfilePath(const std::string& dir, const std::string& key) {
  // FNV-1a: a stable file name for the key (the key itself is inside the file).
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.json", static_cast<unsigned long long>(h));
  return JoinPath(JoinPath(dir, kShapeProfileDir), name);
}

StatusOr<ShapeProfile> ReadShapeProfile(const std::string& path) {
  // The daemon's profile cache (profile_dir), not a job's file: with the process's own rights
  // (common/file_identity.h).
  ScopedJobFileIdentity daemon_own(std::nullopt);
  if (!PathExists(path)) return NotFoundError("no shape profile at " + path);
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    ShapeProfile p;
    p.key = j.at("key").get<std::string>();
    p.gpu = j.at("gpu").get<std::string>();
    p.model = j.at("model").get<std::string>();
    p.batch = j.at("batch").get<int64_t>();
    p.seq = j.at("seq").get<int64_t>();
    p.dtype = j.at("dtype").get<std::string>();
    p.profiled_step = j.at("profiled_step").get<int64_t>();
    p.gpu_seconds = j.at("gpu_seconds").get<double>();
    p.peak_reserved_bytes = j.at("peak_reserved_bytes").get<int64_t>();
    p.peak_allocated_bytes = j.at("peak_allocated_bytes").get<int64_t>();
    p.workspace_bytes = j.at("workspace_bytes").get<int64_t>();
    p.measured_at = j.at("measured_at").get<std::string>();
    for (const auto& b : j.at("blocks")) {
      BlockProfile bp;
      bp.name = b.at("name").get<std::string>();
      bp.mode = b.at("mode").get<std::string>();
      bp.forward_s = b.at("forward_s").get<double>();
      bp.backward_s = b.at("backward_s").get<double>();
      bp.recompute_s = b.at("recompute_s").get<double>();
      bp.keep_bytes = b.at("keep_bytes").get<int64_t>();
      bp.recompute_bytes = b.at("recompute_bytes").get<int64_t>();
      bp.forward_transient_bytes = b.at("forward_transient_bytes").get<int64_t>();
      bp.backward_transient_bytes = b.at("backward_transient_bytes").get<int64_t>();
      if (!(bp.forward_s >= 0) || !(bp.backward_s >= 0) || !(bp.recompute_s >= 0) ||
          bp.keep_bytes < 0 || bp.recompute_bytes < 0) {
        return InvalidArgumentError(path + ": block " + bp.name + " has a negative time or size");
      }
      p.blocks.push_back(std::move(bp));
    }
    if (p.blocks.empty() || p.batch < 1 || p.seq < 1 || p.workspace_bytes < 0) {
      return InvalidArgumentError(path + ": not a measured shape profile (no blocks or no shape)");
    }
    if (p.key != ShapeProfileKey(p.gpu, p.model, p.batch, p.seq, p.dtype)) {
      return InvalidArgumentError(path + ": its key does not match its fields");
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(path + ": not a shape profile: " + e.what());
  }
}

std::string ShapeProfileJson(const ShapeProfile& p) {
  nlohmann::json blocks = nlohmann::json::array();
  for (const auto& b : p.blocks) {
    blocks.push_back({{"name", b.name},
                      {"mode", b.mode},
                      {"forward_s", b.forward_s},
                      {"backward_s", b.backward_s},
                      {"recompute_s", b.recompute_s},
                      {"keep_bytes", b.keep_bytes},
                      {"recompute_bytes", b.recompute_bytes},
                      {"forward_transient_bytes", b.forward_transient_bytes},
                      {"backward_transient_bytes", b.backward_transient_bytes}});
  }
  const nlohmann::json j = {{"key", p.key},
                            {"gpu", p.gpu},
                            {"model", p.model},
                            {"batch", p.batch},
                            {"seq", p.seq},
                            {"dtype", p.dtype},
                            {"profiled_step", p.profiled_step},
                            {"gpu_seconds", p.gpu_seconds},
                            {"peak_reserved_bytes", p.peak_reserved_bytes},
                            {"peak_allocated_bytes", p.peak_allocated_bytes},
                            {"workspace_bytes", p.workspace_bytes},
                            {"measured_at", p.measured_at},
                            {"blocks", blocks}};
  return j.dump(1) + "\n";
}

Status WriteShapeProfile(const std::string& dir, const ShapeProfile& p) {
  // The daemon's profile cache (profile_dir), not a job's file: with the process's own rights
  // (common/file_identity.h).
  ScopedJobFileIdentity daemon_own(std::nullopt);
  RETURN_IF_ERROR(MakeDirs(JoinPath(dir, kShapeProfileDir)));
  return WriteFileAtomically(ShapeProfilePath(dir, p.key), ShapeProfileJson(p));
}

std::vector<ShapeProfile> ListShapeProfiles(const std::string& dir, std::vector<std::string>* problems) {
  std::vector<ShapeProfile> out;
  const std::string sub = JoinPath(dir, kShapeProfileDir);
  DIR* d = opendir(sub.c_str());
  if (d == nullptr) return out;
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    auto p = ReadShapeProfile(JoinPath(sub, name));
    if (p.ok()) {
      out.push_back(std::move(*p));
    } else if (problems) {
      problems->push_back(std::string(p.status().message()));
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const ShapeProfile& a, const ShapeProfile& b) {
    return a.measured_at > b.measured_at;
  });
  return out;
}

std::string DescribeBlockProfile(const BlockProfile& b) {
  char buf[384];
  std::snprintf(buf, sizeof(buf),
                "%s (%s): forward %.2f ms, backward %.2f ms (recompute %.2f ms), activations %s "
                "kept / %s recomputed, transients %s forward / %s backward",
                b.name.c_str(), b.mode.c_str(), 1e3 * b.forward_s, 1e3 * b.backward_s,
                1e3 * b.recompute_s, FormatByteSize(static_cast<uint64_t>(b.keep_bytes)).c_str(),
                FormatByteSize(static_cast<uint64_t>(b.recompute_bytes)).c_str(),
                FormatByteSize(static_cast<uint64_t>(b.forward_transient_bytes)).c_str(),
                FormatByteSize(static_cast<uint64_t>(b.backward_transient_bytes)).c_str());
  return buf;
}

}  // namespace offloadd::trainer
