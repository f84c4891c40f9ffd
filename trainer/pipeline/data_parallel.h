#pragma once
// DataParallel: the c10d process group of one data-parallel job (docs/data_parallel.md): NCCL
// between the GPUs of a host, Gloo between CPU executors (the CI test, and the network test).
// PyTorch's own engine, from LibTorch: the store (FileStore for "file://", TCPStore for
// "tcp://host:port", rank 0 listening) and the backend.
//
// The collectives the pipeline uses: per block, a reduce-scatter of its flat gradients (SUM; each
// rank keeps its 1/world shard); per step, an all-reduce of the loss. Both are issued in the same
// order on every rank by the step loop. On CUDA the calls return at once: the compute stream
// waits for the collective on the backend's stream, the host does not.
//
// Across hosts (config.hosts > 1; world / hosts ranks per host, numbered host by host):
// AllGather brings every rank's shard of its host's updated slice back, and SumAcrossHosts adds
// one double per step over a second, CPU (Gloo) group of the hosts' leaders (local rank 0), for
// the optimizer thread's clipping decision, so that it never interleaves with the step loop's
// collectives on the first. A failed collective names the lost host: every rank bumps a
// heartbeat counter in the store, and the ranks whose counters stand still are named.
//
// Thread-compatible: the step loop's thread only, except SumAcrossHosts (the optimizer thread's)
// and AllGatherBlock (the gather thread's).

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "job/train_config.h"

namespace offloadd::trainer {

class DataParallel {
 public:
  // Joins the group (blocks until every rank has, within config.timeout_seconds).
  static StatusOr<std::unique_ptr<DataParallel>> Create(const ParallelConfig& config, c10::Device device);
  ~DataParallel();

  int rank() const { return rank_; }
  int world() const { return world_; }
  const char* backend_name() const;

  // Elements a block of `numel` is padded to, so that it splits into world equal shards.
  int64_t Padded(int64_t numel) const;
  // `input`: [Padded(n)] on the device; `shard`: [Padded(n) / world], this rank's part of the sum.
  Status ReduceScatter(at::Tensor& input, at::Tensor& shard);
  Status AllReduceSum(at::Tensor& t);
  // `shard`: [Padded(n) / world] on the device, this rank's part; `full`: [Padded(n)], every
  // rank's parts in rank order.
  Status AllGather(at::Tensor& shard, at::Tensor& full);
  // Across hosts, on a host's leader: the sum of `value` over the hosts (the side group).
  StatusOr<double> SumAcrossHosts(double value);
  // Across hosts: AllGather on a third group (NCCL on CUDA, Gloo on the CPU) for the gather
  // thread (HostGather), whose all-gathers overlap the step loop's collectives on the first. On
  // CUDA `shard` may be `full`'s own part of this rank (in place) and the call returns once the
  // current stream waits for the collective; on the CPU it returns when done.
  Status AllGatherBlock(at::Tensor& shard, at::Tensor& full);
  Status Barrier();
  // A small value every rank can read (rank 0 writes, the others wait for it).
  Status Set(const std::string& key, const std::string& value);
  StatusOr<std::string> Get(const std::string& key);

 private:
  struct State;
  DataParallel() = default;
  void StartHeartbeat();
  std::string LostHosts() const;  // "; lost: host 1 (rank 2, 3, on ...) stopped answering"
  Status Wrap(const char* what, const std::function<void()>& fn) const;
  std::unique_ptr<State> state_;
  int rank_ = 0, world_ = 1;
};

}  // namespace offloadd::trainer
