#include "trainer/node_profile_file.h"

#include <nlohmann/json.hpp>

#include "engine/file_util.h"

namespace offloadd::trainer {

StatusOr<NodeProfile> ReadNodeProfile(const std::string& path) {
  if (!engine::PathExists(path)) return NotFoundError("no node profile at " + path);
  ASSIGN_OR_RETURN(std::string text, engine::ReadFile(path));
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    NodeProfile p;
    p.key = j.at("key").get<std::string>();
    p.host_bytes_per_s = j.at("host_bytes_per_s").get<double>();
    p.cpu_params_per_s = j.at("cpu_params_per_s").get<double>();
    p.threads = j.at("threads").get<int>();
    p.kernel = j.at("kernel").get<std::string>();
    p.h2d_bytes_per_s = j.at("h2d_bytes_per_s").get<double>();
    p.d2h_bytes_per_s = j.at("d2h_bytes_per_s").get<double>();
    p.both_bytes_per_s = j.at("both_bytes_per_s").get<double>();
    p.measure_seconds = j.at("measure_seconds").get<double>();
    p.measured_at = j.at("measured_at").get<std::string>();
    if (!(p.host_bytes_per_s > 0) || !(p.cpu_params_per_s > 0) || p.threads < 1) {
      return InvalidArgumentError(path + ": not a measured node profile (zero rates)");
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(path + ": not a node profile: " + e.what());
  }
}

std::string NodeProfileJson(const NodeProfile& p) {
  const nlohmann::json j = {{"key", p.key},
                            {"host_bytes_per_s", p.host_bytes_per_s},
                            {"cpu_params_per_s", p.cpu_params_per_s},
                            {"threads", p.threads},
                            {"kernel", p.kernel},
                            {"h2d_bytes_per_s", p.h2d_bytes_per_s},
                            {"d2h_bytes_per_s", p.d2h_bytes_per_s},
                            {"both_bytes_per_s", p.both_bytes_per_s},
                            {"measure_seconds", p.measure_seconds},
                            {"measured_at", p.measured_at}};
  return j.dump(2) + "\n";
}

}  // namespace offloadd::trainer
