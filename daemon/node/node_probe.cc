#include "daemon/node/node_probe.h"

#include <dirent.h>
#include <liburing.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

namespace offloadd::daemon {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Reads "Key:   123 kB" lines of a meminfo-style file into bytes.
uint64_t MeminfoValue(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t pos = line.find(key + ":");
    if (pos == std::string::npos) continue;
    std::istringstream v(line.substr(pos + key.size() + 1));
    uint64_t n = 0;
    std::string unit;
    v >> n >> unit;
    return unit == "kB" ? n * 1024 : n;
  }
  return 0;
}

CpuFacts ProbeCpu() {
  CpuFacts cpu;
  cpu.logical_cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::set<std::pair<std::string, std::string>> cores;
  std::string physical_id, core_id;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "model name" && cpu.model_name.empty()) cpu.model_name = value;
    if (key == "physical id") physical_id = value;
    if (key == "core id") {
      core_id = value;
      cores.insert({physical_id, core_id});
    }
    if (key == "flags" && !cpu.avx2) {
      std::istringstream flags(" " + value + " ");
      std::string f;
      while (flags >> f) {
        cpu.avx2 |= f == "avx2";
        cpu.avx512f |= f == "avx512f";
        cpu.avx512_bf16 |= f == "avx512_bf16";
      }
    }
  }
  cpu.physical_cores = cores.empty() ? cpu.logical_cores : static_cast<int>(cores.size());
  return cpu;
}

MemoryFacts ProbeMemory() {
  MemoryFacts m;
  m.total_bytes = MeminfoValue("/proc/meminfo", "MemTotal");
  m.available_bytes = MeminfoValue("/proc/meminfo", "MemAvailable");
  m.hugepage_size_bytes = MeminfoValue("/proc/meminfo", "Hugepagesize");
  m.hugepages_total = MeminfoValue("/proc/meminfo", "HugePages_Total");
  m.hugepages_free = MeminfoValue("/proc/meminfo", "HugePages_Free");
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    m.memlock_limit_bytes = lim.rlim_cur;
  }
  struct statvfs vfs{};
  if (statvfs("/dev/shm", &vfs) == 0) m.shm_available_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  return m;
}

std::vector<NumaFacts> ProbeNuma() {
  std::vector<NumaFacts> nodes;
  const std::string root = "/sys/devices/system/node";
  DIR* d = opendir(root.c_str());
  if (d == nullptr) return nodes;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "node", 4) != 0) continue;
    char* end = nullptr;
    const long id = std::strtol(e->d_name + 4, &end, 10);
    if (end == e->d_name + 4 || *end != '\0') continue;
    NumaFacts n;
    n.id = static_cast<int>(id);
    const std::string dir = root + "/" + e->d_name;
    n.cpus = ReadFirstLine(dir + "/cpulist");
    n.memory_total_bytes = MeminfoValue(dir + "/meminfo", "MemTotal");
    nodes.push_back(n);
  }
  closedir(d);
  std::sort(nodes.begin(), nodes.end(), [](const NumaFacts& a, const NumaFacts& b) { return a.id < b.id; });
  return nodes;
}

StoreDirFacts ProbeStoreDir(const StoreDirInput& in) {
  StoreDirFacts s;
  s.path = in.path;
  s.weight = in.weight;
  struct statvfs vfs{};
  if (statvfs(in.path.c_str(), &vfs) != 0) {
    s.problem = errno == ENOENT ? std::string("missing: no such directory") : std::string("cannot stat: ") + std::strerror(errno);
    return s;
  }
  s.capacity_bytes = uint64_t{vfs.f_blocks} * vfs.f_frsize;
  s.available_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  if (access(in.path.c_str(), W_OK) != 0) s.problem = std::string("not writable: ") + std::strerror(errno);
  return s;
}

// sysfs names PCI devices "dddd:bb:dd.f" in lower case with a 4-digit domain.
std::string SysfsPciName(const std::string& pci_bus_id) {
  std::string id = pci_bus_id;
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // NVML's "00000000:3b:00.0" -> "0000:3b:00.0" (wider domains, e.g. VMD's 10000, stay).
  size_t colon = id.find(':');
  while (colon != std::string::npos && colon > 4 && id[0] == '0') {
    id.erase(0, 1);
    --colon;
  }
  return id;
}

}  // namespace

int PciNumaNode(const std::string& pci_bus_id, const std::string& sysfs_root) {
  if (pci_bus_id.empty() || pci_bus_id.find('/') != std::string::npos) return -1;
  const std::string text =
      ReadFirstLine(sysfs_root + "/bus/pci/devices/" + SysfsPciName(pci_bus_id) + "/numa_node");
  char* end = nullptr;
  const long node = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || node < 0 || node > 65535) return -1;
  return static_cast<int>(node);
}

bool ProbeIoUring(std::string* problem) {
  io_uring ring{};
  const int rc = io_uring_queue_init(2, &ring, 0);
  if (rc < 0) {
    *problem = std::string("io_uring_queue_init failed: ") + std::strerror(-rc) +
               " (kernel too old, io_uring disabled by sysctl kernel.io_uring_disabled, or blocked by seccomp)";
    return false;
  }
  io_uring_queue_exit(&ring);
  problem->clear();
  return true;
}

NodeFacts ProbeNodeResources(const std::vector<StoreDirInput>& store_dirs) {
  NodeFacts f;
  f.memory = ProbeMemory();
  f.gpus = ProbeGpus(&f.gpu_problem);
  ProbedGpuDriver(&f.gpu_driver, &f.gpu_driver_problem);
  for (auto& g : f.gpus) g.numa_node = PciNumaNode(g.pci_bus_id);
  for (const auto& d : store_dirs) f.store_dirs.push_back(ProbeStoreDir(d));
  return f;
}

NodeFacts ProbeNode(const std::vector<StoreDirInput>& store_dirs) {
  NodeFacts f = ProbeNodeResources(store_dirs);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  f.hostname = host;
  utsname u{};
  if (uname(&u) == 0) f.kernel_release = u.release;
  f.cpu = ProbeCpu();
  f.numa_nodes = ProbeNuma();
  f.io_uring_available = ProbeIoUring(&f.io_uring_problem);
  return f;
}

}  // namespace offloadd::daemon
