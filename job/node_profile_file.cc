#include "job/node_profile_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>

#include "common/file.h"

namespace offloadd::trainer {

void SumStoreRates(NodeProfile* p) {
  p->store_dir = p->stores.empty() ? "" : p->stores[0].dir;
  p->store_read_bytes_per_s = p->store_write_bytes_per_s = 0;
  p->store_direct_io = !p->stores.empty();
  std::vector<const NodeProfile::StoreRate*> fastest;  // per device
  for (const auto& s : p->stores) {
    p->store_direct_io = p->store_direct_io && s.direct_io;
    auto it = std::find_if(fastest.begin(), fastest.end(),
                           [&](const NodeProfile::StoreRate* f) { return f->device == s.device; });
    if (it == fastest.end()) {
      fastest.push_back(&s);
    } else if (s.read_bytes_per_s + s.write_bytes_per_s >
               (*it)->read_bytes_per_s + (*it)->write_bytes_per_s) {
      *it = &s;
    }
  }
  for (const auto* f : fastest) {
    p->store_read_bytes_per_s += f->read_bytes_per_s;
    p->store_write_bytes_per_s += f->write_bytes_per_s;
  }
}

StatusOr<NodeProfile> ReadNodeProfile(const std::string& path) {
  if (!PathExists(path)) return NotFoundError("no node profile at " + path);
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
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
    // Added later: absent in older profiles (then empty or 0).
    for (const auto& r : j.value("adamw_by_threads", nlohmann::json::array())) {
      p.adamw_by_threads.push_back({r.at("threads").get<int>(), r.at("params_per_s").get<double>()});
    }
    p.cpu_params_per_s_during_dma = j.value("cpu_params_per_s_during_dma", 0.0);
    p.store_dir = j.value("store_dir", std::string());
    p.store_read_bytes_per_s = j.value("store_read_bytes_per_s", 0.0);
    p.store_write_bytes_per_s = j.value("store_write_bytes_per_s", 0.0);
    p.store_direct_io = j.value("store_direct_io", false);
    for (const auto& r : j.value("stores", nlohmann::json::array())) {
      p.stores.push_back({r.at("dir").get<std::string>(), r.at("read_bytes_per_s").get<double>(),
                          r.at("write_bytes_per_s").get<double>(), r.value("direct_io", false),
                          r.value("device", uint64_t{0})});
    }
    if (!(p.host_bytes_per_s > 0) || !(p.cpu_params_per_s > 0) || p.threads < 1) {
      return InvalidArgumentError(path + ": not a measured node profile (zero rates)");
    }
    return p;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(path + ": not a node profile: " + e.what());
  }
}

std::string NodeProfileJson(const NodeProfile& p) {
  nlohmann::json by_threads = nlohmann::json::array();
  for (const auto& r : p.adamw_by_threads) by_threads.push_back({{"threads", r.threads}, {"params_per_s", r.params_per_s}});
  nlohmann::json stores = nlohmann::json::array();
  for (const auto& s : p.stores) {
    stores.push_back({{"dir", s.dir},
                      {"read_bytes_per_s", s.read_bytes_per_s},
                      {"write_bytes_per_s", s.write_bytes_per_s},
                      {"direct_io", s.direct_io},
                      {"device", s.device}});
  }
  const nlohmann::json j = {{"key", p.key},
                            {"host_bytes_per_s", p.host_bytes_per_s},
                            {"cpu_params_per_s", p.cpu_params_per_s},
                            {"threads", p.threads},
                            {"kernel", p.kernel},
                            {"h2d_bytes_per_s", p.h2d_bytes_per_s},
                            {"d2h_bytes_per_s", p.d2h_bytes_per_s},
                            {"both_bytes_per_s", p.both_bytes_per_s},
                            {"measure_seconds", p.measure_seconds},
                            {"measured_at", p.measured_at},
                            {"adamw_by_threads", by_threads},
                            {"cpu_params_per_s_during_dma", p.cpu_params_per_s_during_dma},
                            {"store_dir", p.store_dir},
                            {"store_read_bytes_per_s", p.store_read_bytes_per_s},
                            {"store_write_bytes_per_s", p.store_write_bytes_per_s},
                            {"store_direct_io", p.store_direct_io},
                            {"stores", stores}};
  return j.dump(2) + "\n";
}

}  // namespace offloadd::trainer
