#pragma once
// The torchrun environment: how torchrun, a Slurm batch script (srun exporting them from
// SLURM_PROCID and friends) and Kubeflow's PyTorchJob tell each process its place in a group
// (docs/data_parallel.md). offloadd-train reads it instead of --rank/--world-size/--rendezvous:
//
//   MASTER_ADDR, MASTER_PORT  where the c10d TCPStore is (rank 0 serves it, unless
//                             TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves it)
//   RANK, WORLD_SIZE          this process's rank in the group, and the group's size
//   LOCAL_RANK                its rank among the processes of its host (its GPU: cuda:LOCAL_RANK)
//   LOCAL_WORLD_SIZE          processes per host (absent: 1, no memory assumed shared)
//   GROUP_RANK, GROUP_WORLD_SIZE  the host's index and the host count (torchrun's node rank)
//
// The ranks of one host share its arena, as --gpus's ranks do; ranks on different hosts cannot:
// across hosts each rank (LOCAL_WORLD_SIZE=1) holds its own 1/GROUP_WORLD_SIZE slice of the
// optimizer states (ZeRO-1 across hosts), and several ranks per host across hosts are refused by
// name. Torch-free; thread-compatible.

#include <functional>
#include <optional>
#include <string>

#include "common/status.h"
#include "job/train_config.h"

namespace offloadd::trainer {

struct TorchrunEnv {
  std::string master_addr;
  int master_port = 0;
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  int group_rank = 0, group_world_size = 1;  // the host, and the hosts
  bool agent_store = false;                  // TORCHELASTIC_USE_AGENT_STORE=True
};

// getenv, or a test's table: nullptr when the variable is not set.
using EnvLookup = std::function<const char*(const char*)>;

// nullopt when none of MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK is set. A missing,
// malformed or inconsistent variable is INVALID_ARGUMENT naming it ("RANK=4 is not below
// WORLD_SIZE=4").
StatusOr<std::optional<TorchrunEnv>> ReadTorchrunEnv(const EnvLookup& env);

// Places this process in the group `e` describes: config.parallel (rendezvous
// tcp://MASTER_ADDR:MASTER_PORT) and, for --device=cuda, config.device = cuda:LOCAL_RANK.
// `launcher_ranks`: --gpus. INVALID_ARGUMENT when flags or the job file place it too (--rank,
// --rendezvous, --gpus, a world size other than WORLD_SIZE); UNIMPLEMENTED when the ranks span
// more than one host with more than one rank on each (LOCAL_WORLD_SIZE > 1). One rank per host
// sets config.parallel.hosts = GROUP_WORLD_SIZE: the states are partitioned across the hosts.
Status ApplyTorchrunEnv(const TorchrunEnv& e, int launcher_ranks, TrainConfig* config);

}  // namespace offloadd::trainer
