// offloadd-plan: the step planner (job/step_planner.h) on JSON.
//   offloadd-plan INPUTS.json   (or - for stdin)
// INPUTS: the PlanInputs fields by name (arrays per block, embedding first). Prints the chosen
// plan as one JSON object (device_blocks, keep_layers, predicted_s, bound, per-resource seconds,
// gpu_bytes) and its description on stderr. Exit 1 with a message naming the field on bad input.
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "job/step_planner.h"

namespace {

using offloadd::trainer::PlanInputs;

template <typename T>
void Read(const nlohmann::json& j, const char* name, T* out, bool required) {
  if (!j.contains(name)) {
    if (required) throw std::runtime_error(std::string("missing field '") + name + "'");
    return;
  }
  try {
    *out = j.at(name).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(std::string("field '") + name + "': " + e.what());
  }
}

PlanInputs Parse(const nlohmann::json& j) {
  PlanInputs in;
  Read(j, "params", &in.params, true);
  Read(j, "device_state_bytes", &in.device_state_bytes, true);
  Read(j, "keep_extra_bytes", &in.keep_extra_bytes, true);
  Read(j, "recompute_seconds", &in.recompute_seconds, true);
  Read(j, "budget_bytes", &in.budget_bytes, true);
  Read(j, "base_peak_bytes", &in.base_peak_bytes, true);
  Read(j, "margin_bytes", &in.margin_bytes, false);
  Read(j, "gpu_seconds", &in.gpu_seconds, true);
  Read(j, "h2d_bytes", &in.h2d_bytes, true);
  Read(j, "d2h_bytes", &in.d2h_bytes, true);
  Read(j, "host_bytes_per_s", &in.host_bytes_per_s, true);
  Read(j, "cpu_params_per_s", &in.cpu_params_per_s, true);
  Read(j, "h2d_bytes_per_s", &in.h2d_bytes_per_s, true);
  Read(j, "d2h_bytes_per_s", &in.d2h_bytes_per_s, true);
  Read(j, "host_bytes_per_param", &in.host_bytes_per_param, false);
  Read(j, "h2d_saved_per_param", &in.h2d_saved_per_param, false);
  Read(j, "d2h_saved_per_param", &in.d2h_saved_per_param, false);
  Read(j, "device_seconds_per_param", &in.device_seconds_per_param, false);
  Read(j, "place_states", &in.place_states, false);
  Read(j, "keep_activations", &in.keep_activations, false);
  Read(j, "fixed_device_blocks", &in.fixed_device_blocks, false);
  Read(j, "held_updates", &in.held_updates, false);
  Read(j, "cpu_params_per_s_during_dma", &in.cpu_params_per_s_during_dma, false);
  Read(j, "gpu_forward_seconds", &in.gpu_forward_seconds, false);
  Read(j, "norm_tail_seconds", &in.norm_tail_seconds, false);
  Read(j, "update_tail_seconds", &in.update_tail_seconds, false);
  Read(j, "nvme_params", &in.nvme_params, false);
  Read(j, "nvme_read_bytes_per_s", &in.nvme_read_bytes_per_s, false);
  Read(j, "nvme_write_bytes_per_s", &in.nvme_write_bytes_per_s, false);
  Read(j, "nvme_activation_bytes", &in.nvme_activation_bytes, false);
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "--help") {
    std::cerr << "usage: offloadd-plan INPUTS.json|-\n";
    return argc == 2 ? 0 : 2;
  }
  std::string text;
  if (std::string(argv[1]) == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    std::ifstream f(argv[1]);
    if (!f) {
      std::cerr << "offloadd-plan: cannot read " << argv[1] << "\n";
      return 1;
    }
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  PlanInputs in;
  try {
    in = Parse(nlohmann::json::parse(text));
  } catch (const std::exception& e) {
    std::cerr << "offloadd-plan: " << e.what() << "\n";
    return 1;
  }
  auto plan = offloadd::trainer::SolvePlan(in);
  if (!plan.ok()) {
    std::cerr << "offloadd-plan: " << plan.status().ToString() << "\n";
    return 1;
  }
  const auto& c = *plan;
  std::cout << nlohmann::json{{"device_blocks", c.device_blocks},
                              {"keep_layers", c.keep_layers},
                              {"predicted_s", c.predicted_s},
                              {"bound", c.bound},
                              {"gpu_s", c.gpu_s},
                              {"cpu_s", c.cpu_s},
                              {"host_s", c.host_s},
                              {"h2d_s", c.h2d_s},
                              {"d2h_s", c.d2h_s},
                              {"held_s", c.held_s},
                              {"nvme_s", c.nvme_s},
                              {"gpu_bytes", c.gpu_bytes}}
                   .dump()
            << "\n";
  std::cerr << offloadd::trainer::DescribePlan(c, in.budget_bytes) << "\n";
  return 0;
}
