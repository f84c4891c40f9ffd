#include "workers/cpu_topology.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>

namespace offloadd::workers {

StatusOr<std::vector<int>> ParseCpuList(std::string_view text) {
  std::vector<int> out;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text.empty()) return out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string_view item = text.substr(pos, comma - pos);
    const size_t dash = item.find('-');
    try {
      const int lo = std::stoi(std::string(item.substr(0, dash)));
      const int hi =
          dash == std::string_view::npos ? lo : std::stoi(std::string(item.substr(dash + 1)));
      if (lo < 0 || hi < lo || hi > 65535) throw std::out_of_range("range");
      for (int c = lo; c <= hi; ++c) out.push_back(c);
    } catch (const std::exception&) {
      return InvalidArgumentError("malformed cpu list '" + std::string(text) + "' near '" +
                                  std::string(item) + "'");
    }
    pos = comma + 1;
  }
  return out;
}

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

namespace {

std::vector<std::pair<int, std::vector<int>>> ScanNodes(const std::vector<int>& allowed,
                                                        const std::string& sys_root) {
  const std::set<int> ok(allowed.begin(), allowed.end());
  std::vector<std::pair<int, std::vector<int>>> nodes;
  // readdir, not std::filesystem: the worker pool runs inside LibTorch-linked binaries (the
  // daemon, the trainer), where the CUDA libtorch.so interposes its own std::filesystem.
  std::vector<std::string> names;
  if (DIR* dir = opendir(sys_root.c_str())) {
    while (const dirent* e = readdir(dir)) names.emplace_back(e->d_name);
    closedir(dir);
  }
  for (const std::string& name : names) {
    if (name.rfind("node", 0) != 0 || name.size() == 4 ||
        !std::all_of(name.begin() + 4, name.end(), ::isdigit)) {
      continue;
    }
    std::ifstream in(sys_root + "/" + name + "/cpulist");
    std::string line;
    std::getline(in, line);
    auto cpus = ParseCpuList(line);
    if (!cpus.ok()) continue;
    std::vector<int> mine;
    for (int c : *cpus) {
      if (ok.count(c)) mine.push_back(c);
    }
    if (!mine.empty()) nodes.emplace_back(std::stoi(name.substr(4)), std::move(mine));
  }
  std::sort(nodes.begin(), nodes.end());
  if (nodes.empty() && !allowed.empty()) nodes.emplace_back(0, allowed);  // no NUMA info: one node
  return nodes;
}

}  // namespace

std::vector<std::vector<int>> NumaNodes(const std::vector<int>& allowed,
                                        const std::string& sys_root) {
  std::vector<std::vector<int>> out;
  for (auto& [id, cpus] : ScanNodes(allowed, sys_root)) out.push_back(std::move(cpus));
  return out;
}

std::vector<int> NumaNodeIds(const std::vector<int>& allowed, const std::string& sys_root) {
  std::vector<int> out;
  for (const auto& [id, cpus] : ScanNodes(allowed, sys_root)) out.push_back(id);
  return out;
}

CpuPlan PlanWorkerCpus(uint32_t processes, uint32_t threads,
                       const std::vector<std::vector<int>>& nodes) {
  CpuPlan plan;
  if (nodes.empty()) {
    plan.cpus.assign(processes, {});
    plan.node.assign(processes, 0);
    return plan;
  }
  std::vector<size_t> next(nodes.size(), 0);
  size_t total = 0;
  for (const auto& n : nodes) total += n.size();
  plan.oversubscribed = uint64_t{processes} * threads > total;
  for (uint32_t p = 0; p < processes; ++p) {
    const size_t node = p % nodes.size();
    std::vector<int> cpus;
    for (uint32_t t = 0; t < threads; ++t) {
      cpus.push_back(nodes[node][next[node] % nodes[node].size()]);
      ++next[node];
    }
    plan.cpus.push_back(std::move(cpus));
    plan.node.push_back(static_cast<int>(node));
  }
  return plan;
}

}  // namespace offloadd::workers
