#pragma once
// offloadd-train --gpus=N: runs this program once per rank of a data-parallel group
// on this host, through the one child launcher (ipc/child_process.h: death signal, closed fds,
// pidfd), each rank with --rank/--world-size and a fresh file:// rendezvous, and on CUDA its own
// GPU as its only visible device. When a rank fails the others are killed: a group with a rank
// gone would wait in its next collective until the timeout. Returns the exit code: 0 when every
// rank succeeded, else the first failure's (with a line naming the rank and how it ended).
#include <string>
#include <vector>

namespace offloadd::trainer {

// `args`: this program's arguments without --gpus. `cuda`: one GPU per rank (CUDA_VISIBLE_DEVICES
// of rank r is the r-th entry of the caller's list, or r).
int RunRanks(const std::string& self, const std::vector<std::string>& args, int ranks, bool cuda);

}  // namespace offloadd::trainer
