#include "train/torchrun_env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <initializer_list>

namespace offloadd::trainer {
namespace {

// A decimal integer in [lo, hi], the whole value: "4x", "" and "-1" for a size are refused.
StatusOr<int> Int(const EnvLookup& env, const char* name, long lo, long hi) {
  const char* v = env(name);
  if (v == nullptr) return InvalidArgumentError(std::string(name) + " is not set");
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno != 0 || x < lo || x > hi) {
    return InvalidArgumentError(std::string(name) + "='" + v + "' is not an integer in " +
                                std::to_string(lo) + ".." + std::to_string(hi));
  }
  return static_cast<int>(x);
}

std::string Named(const char* name, int value) {
  return std::string(name) + "=" + std::to_string(value);
}

}  // namespace

StatusOr<std::optional<TorchrunEnv>> ReadTorchrunEnv(const EnvLookup& env) {
  bool any = false;
  for (const char* k : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"}) {
    any |= env(k) != nullptr;
  }
  if (!any) return std::optional<TorchrunEnv>();
  const std::string why =
      " (the torchrun environment: MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE)";
  TorchrunEnv e;
  const char* addr = env("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') return InvalidArgumentError("MASTER_ADDR is not set" + why);
  e.master_addr = addr;
  auto port = Int(env, "MASTER_PORT", 1, 65535);
  if (!port.ok()) return port.status().WithContext("torchrun environment");
  e.master_port = *port;
  auto world = Int(env, "WORLD_SIZE", 1, INT_MAX);
  if (!world.ok()) return world.status().WithContext("torchrun environment");
  e.world_size = *world;
  auto rank = Int(env, "RANK", 0, INT_MAX);
  if (!rank.ok()) return rank.status().WithContext("torchrun environment");
  e.rank = *rank;
  if (e.rank >= e.world_size) {
    return InvalidArgumentError(Named("RANK", e.rank) + " is not below " +
                                Named("WORLD_SIZE", e.world_size));
  }
  // Absent: one process per host. Memory is shared only between ranks declared to share it.
  e.local_world_size = 1;
  if (env("LOCAL_WORLD_SIZE") != nullptr) {
    ASSIGN_OR_RETURN(e.local_world_size, Int(env, "LOCAL_WORLD_SIZE", 1, e.world_size));
  }
  if (e.world_size % e.local_world_size != 0) {
    return InvalidArgumentError(Named("LOCAL_WORLD_SIZE", e.local_world_size) +
                                " does not divide " + Named("WORLD_SIZE", e.world_size) +
                                " (every host runs as many ranks)");
  }
  e.group_world_size = e.world_size / e.local_world_size;
  e.local_rank = e.rank % e.local_world_size;
  e.group_rank = e.rank / e.local_world_size;
  // torchrun numbers the ranks host by host: RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK.
  if (env("LOCAL_RANK") != nullptr) {
    ASSIGN_OR_RETURN(const int local, Int(env, "LOCAL_RANK", 0, e.local_world_size - 1));
    if (local != e.local_rank) {
      return InvalidArgumentError(Named("LOCAL_RANK", local) + " disagrees with " +
                                  Named("RANK", e.rank) + " and " +
                                  Named("LOCAL_WORLD_SIZE", e.local_world_size) +
                                  " (expected LOCAL_RANK=" + std::to_string(e.local_rank) + ")");
    }
  }
  if (env("GROUP_WORLD_SIZE") != nullptr) {
    ASSIGN_OR_RETURN(const int groups, Int(env, "GROUP_WORLD_SIZE", 1, INT_MAX));
    if (groups != e.group_world_size) {
      return InvalidArgumentError(Named("GROUP_WORLD_SIZE", groups) + " disagrees with " +
                                  Named("WORLD_SIZE", e.world_size) + " / " +
                                  Named("LOCAL_WORLD_SIZE", e.local_world_size));
    }
  }
  if (env("GROUP_RANK") != nullptr) {
    ASSIGN_OR_RETURN(const int group, Int(env, "GROUP_RANK", 0, e.group_world_size - 1));
    if (group != e.group_rank) {
      return InvalidArgumentError(Named("GROUP_RANK", group) + " disagrees with " +
                                  Named("RANK", e.rank) +
                                  " (expected GROUP_RANK=" + std::to_string(e.group_rank) +
                                  ": RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK)");
    }
  }
  const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
  e.agent_store =
      agent != nullptr && std::string(agent) == "True";  // as torch.distributed reads it
  return std::optional<TorchrunEnv>(e);
}

Status ApplyTorchrunEnv(const TorchrunEnv& e, int launcher_ranks, TrainConfig* config) {
  ParallelConfig& p = config->parallel;
  const std::string placed = "the torchrun environment (RANK=" + std::to_string(e.rank) +
                             ", WORLD_SIZE=" + std::to_string(e.world_size) +
                             ") places this process; ";
  if (launcher_ranks > 1)
    return InvalidArgumentError(placed + "--gpus would start ranks of its own");
  if (p.rank != 0 || !p.rendezvous.empty()) {
    return InvalidArgumentError(placed + "drop --rank and --rendezvous");
  }
  if (p.world_size > 1 && p.world_size != e.world_size) {
    return InvalidArgumentError(placed + "the job asks for " + std::to_string(p.world_size) +
                                " ranks (--world-size or resources.gpus)");
  }
  if (p.hosts > 1 && p.hosts != e.group_world_size) {
    return InvalidArgumentError(placed + "--hosts=" + std::to_string(p.hosts) + " disagrees with " +
                                std::to_string(e.group_world_size) + " hosts (GROUP_WORLD_SIZE)");
  }
  p.hosts = e.group_world_size;
  p.world_size = e.world_size;
  p.rank = e.rank;
  // With e.agent_store, DataParallel connects rank 0 as a client too (it reads
  // TORCHELASTIC_USE_AGENT_STORE itself, as torch.distributed does).
  p.rendezvous = "tcp://" + e.master_addr + ":" + std::to_string(e.master_port);
  // torchrun leaves every GPU visible; a rank trains on its LOCAL_RANK's (torch.cuda.set_device).
  if (config->device == "cuda") config->device = "cuda:" + std::to_string(e.local_rank);
  return OkStatus();
}

}  // namespace offloadd::trainer
