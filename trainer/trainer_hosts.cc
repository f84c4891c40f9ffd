// Trainer across hosts (docs/data_parallel.md, "Across hosts"): ZeRO-1 over H hosts of N ranks.
// Ranks are numbered host by host, so the per-block reduce-scatter over all H x N ranks leaves
// host h's ranks the contiguous slice of the group's gradient sum made of their shards; host h's
// arena (shared by its ranks as on one host: its local rank 0 leads, the others land their shards
// in it) holds the fp32 masters and AdamW states of exactly that slice, so no arena is shared
// between hosts. The clipping decision sums every host's squared norms (DataParallel::
// SumAcrossHosts, from each host leader's optimizer thread), and every rank's shard of the
// updated slices is all-gathered into every rank's whole weights, which its compute reads, block
// by block as each update finishes (HostGather's thread, on a process group of its own).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <span>

#include "ipc/shm_segment.h"
#include "ipc/unique_fd.h"

#include "trainer/state/checkpoint.h"
#include "trainer/state/partition_checkpoint.h"

#include "trainer/trainer_impl.h"

namespace offloadd::trainer {

// Every partition of the checkpoint whose partition 0 is `dir_in` exists (each rank names the
// same missing one, before anything is created: a host's other ranks must not outlive its
// leader's refusal); this host's partition.
namespace {
StatusOr<std::string> ResumePartition(const ParallelConfig& p, const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const int hosts = p.hosts;
  const std::string first = "partition-0-of-" + std::to_string(hosts);
  const size_t slash = dir.rfind('/');
  const std::string parent = slash == std::string::npos ? "" : dir.substr(0, slash);
  const size_t slash2 = parent.rfind('/');
  const std::string parent_name = slash2 == std::string::npos ? parent : parent.substr(slash2 + 1);
  if (slash == std::string::npos || parent_name != first) {
    return FailedPreconditionError(
        dir_in + ": a resume across " + std::to_string(hosts) +
        " hosts takes partition 0 of a checkpoint written across as many: <output_dir>/" + first +
        "/checkpoint-<step>");
  }
  const std::string root = slash2 == std::string::npos ? "." : parent.substr(0, slash2);
  const std::string name = dir.substr(slash + 1);
  auto partition = [&](int h) {
    return root + "/partition-" + std::to_string(h) + "-of-" + std::to_string(hosts) + "/" + name;
  };
  for (int h = 0; h < hosts; ++h) {
    if (access(partition(h).c_str(), F_OK) != 0) {
      return FailedPreconditionError(name + ": partition " + std::to_string(h) + " of " +
                                     std::to_string(hosts) + " is missing (" + partition(h) + ")");
    }
  }
  return partition(p.rank / (p.world_size / hosts));
}
}  // namespace

int64_t Trainer::Impl::SliceBegin(int b) const {
  const int64_t numel = static_cast<int64_t>(layout[b].numel);
  const int64_t chunk = dp->Padded(numel) / dp->world();
  return std::min<int64_t>(numel, int64_t{host_index()} * ranks_per_host() * chunk);
}

int64_t Trainer::Impl::SliceLength(int b) const {
  const int64_t numel = static_cast<int64_t>(layout[b].numel);
  const int64_t chunk = dp->Padded(numel) / dp->world();
  return std::min<int64_t>(chunk * ranks_per_host(), numel - SliceBegin(b));
}

int64_t Trainer::Impl::ShardBegin(int b) const {
  const int64_t numel = static_cast<int64_t>(layout[b].numel);
  return std::min<int64_t>(numel, dp->rank() * (dp->Padded(numel) / dp->world()));
}

int64_t Trainer::Impl::ShardLength(int b) const {
  const int64_t numel = static_cast<int64_t>(layout[b].numel);
  return std::min<int64_t>(dp->Padded(numel) / dp->world(), numel - ShardBegin(b));
}

Status Trainer::Impl::CheckAcrossHosts(const std::string& what) {
  const ParallelConfig& p = cfg.parallel;
  if (p.hosts < 1)
    return InvalidArgumentError("parallel.hosts must be >= 1, got " + std::to_string(p.hosts));
  if (p.hosts == 1) return OkStatus();
  const std::string across = what + " across " + std::to_string(p.hosts) + " hosts";
  if (p.world_size % p.hosts != 0) {
    return InvalidArgumentError(across + ": world_size " + std::to_string(p.world_size) +
                                " is not a multiple of parallel.hosts " + std::to_string(p.hosts) +
                                " (every host runs as many ranks)");
  }
  if (cfg.offload.device_optimizer_blocks > 0 || cfg.offload.device_optimizer_share >= 0) {
    return UnimplementedError(across +
                              " with optimizer states on the GPU (device_optimizer_blocks " +
                              std::to_string(cfg.offload.device_optimizer_blocks) +
                              ") is not built yet; leave it auto (none across hosts) or 0");
  }
  cfg.offload.device_optimizer_blocks = 0;  // auto places none: every state is partitioned
  if (cfg.offload.tier == StateTier::kNvme) {
    return UnimplementedError(across + " with offload_optimizer device nvme is not built yet");
  }
  if (!cfg.resume_from.empty()) RETURN_IF_ERROR(ResumePartition(p, cfg.resume_from).status());
  const bool checkpoints = cfg.save_steps > 0 || !cfg.resume_from.empty();
  if (checkpoints && (cfg.optim.state_dtype != "fp32" || cfg.optim.master_dtype != "fp32")) {
    return UnimplementedError(across + ": checkpoints per partition of optimizer state_dtype " +
                              cfg.optim.state_dtype + " / master_dtype " + cfg.optim.master_dtype +
                              " are not built yet (only fp32 states)");
  }
  return OkStatus();
}

HostOptimizerOptions Trainer::Impl::SliceOptions(HostOptimizerOptions ho) {
  for (int b = 0; b < n; ++b) ho.block_elements[b] = static_cast<uint64_t>(SliceLength(b));
  ho.combine_sq_norm = [d = dp.get()](double local_sq) { return d->SumAcrossHosts(local_sq); };
  return ho;
}

namespace {

// One copy of the whole weights per host: with several ranks on the host (`shared`), in a segment
// its leader creates and its other ranks map (as they map its arena; `key` names it in the
// store), each block on its own pages (pinned apart on CUDA); every rank all-gathers the same
// bytes into it (GatherBlock), so a rank's forward reads the values its own gather wrote
// whichever rank's copy lands last. One rank per host: its own. The tensors keep the mapping
// alive (their deleter holds it).
StatusOr<std::vector<at::Tensor>> WholeWeights(const std::vector<BlockLayout>& layout,
                                               c10::ScalarType dtype, bool shared, bool leader,
                                               const std::string& key, DataParallel& dp) {
  std::vector<at::Tensor> out(layout.size());
  const auto opts = at::TensorOptions().dtype(dtype);
  if (!shared) {
    for (size_t b = 0; b < layout.size(); ++b)
      out[b] = at::empty({static_cast<int64_t>(layout[b].numel)}, opts);
    return out;
  }
  const uint64_t elem = c10::elementSize(dtype);
  std::vector<uint64_t> offset(layout.size());
  uint64_t bytes = 0;
  for (size_t b = 0; b < layout.size(); ++b) {
    offset[b] = bytes;
    bytes += (layout[b].numel * elem + 4095) / 4096 * 4096;
  }
  ipc::SharedSegment segment;
  if (leader) {
    ipc::SegmentOptions so;
    so.name = "offloadd whole weights";
    ASSIGN_OR_RETURN(segment, ipc::SharedSegment::Create(std::max<uint64_t>(bytes, 1), so));
    RETURN_IF_ERROR(
        dp.Set(key, "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(segment.fd())));
  } else {
    ASSIGN_OR_RETURN(const std::string path, dp.Get(key));
    ipc::UniqueFd fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) {
      return UnavailableError("rank " + std::to_string(dp.rank()) +
                              " cannot open its host leader's whole weights " + path + ": " +
                              std::strerror(errno));
    }
    ASSIGN_OR_RETURN(segment, ipc::SharedSegment::Attach(fd.get()));
    if (segment.data_size() < bytes) {
      return FailedPreconditionError(path + ": the host leader's whole weights hold " +
                                     std::to_string(segment.data_size()) + " bytes, this rank's " +
                                     "model " + std::to_string(bytes));
    }
  }
  auto mapped = std::make_shared<ipc::SharedSegment>(std::move(segment));
  for (size_t b = 0; b < layout.size(); ++b) {
    out[b] = at::from_blob(
        mapped->data() + offset[b], {static_cast<int64_t>(layout[b].numel)}, [mapped](void*) {},
        opts);
  }
  return out;
}

}  // namespace

Status Trainer::Impl::InitializeAcrossHosts(
    const std::vector<HostOptimizer::InitPiece>& pieces,
    const std::function<Status(const HostOptimizer::InitPiece&, float*)>& fill) {
  const c10::ScalarType host_dtype = host->weights_fp32() ? at::kFloat : dtype;
  ASSIGN_OR_RETURN(full_weights,
                   WholeWeights(layout, host_dtype, ranks_per_host() > 1, host_leader(),
                                "whole-weights/" + std::to_string(host_index()), *dp));
  std::vector<bool> filled(static_cast<size_t>(n), false);
  auto whole_block = [&](int b) -> StatusOr<at::Tensor> {
    at::Tensor whole = at::empty({static_cast<int64_t>(layout[b].numel)}, at::kFloat);
    for (const HostOptimizer::InitPiece& piece : pieces) {
      if (piece.block == b) RETURN_IF_ERROR(fill(piece, whole.data_ptr<float>() + piece.begin));
    }
    return whole;
  };
  // The host's other ranks wait here until its leader filled the shared arena.
  RETURN_IF_ERROR(host->Initialize([&](int b, float* master) -> Status {
    ASSIGN_OR_RETURN(at::Tensor whole, whole_block(b));
    std::memcpy(master, whole.data_ptr<float>() + SliceBegin(b),
                static_cast<size_t>(SliceLength(b)) * sizeof(float));
    // Rounded as the host optimizer rounds its 16-bit copy (round to nearest even).
    full_weights[b].copy_(whole);
    filled[b] = true;
    return OkStatus();
  }));
  // A follower's host leader filled the host's copy before the arena (ranks_per_host > 1).
  if (!host_leader()) return OkStatus();
  for (int b = 0; b < n; ++b) {
    if (filled[b]) continue;
    ASSIGN_OR_RETURN(at::Tensor whole, whole_block(b));
    full_weights[b].copy_(whole);
  }
  return OkStatus();
}

Status Trainer::Impl::StartGather() {
  HostGather::Hooks h;
  h.wait_updated = [this](int b, uint64_t step) { return host->WaitUpdated(b, step); };
  if (scaler) {  // fp16: a step with a non-finite global norm is skipped on every host alike
    h.skipped = [this](uint64_t step) -> StatusOr<bool> {
      ASSIGN_OR_RETURN(const workers::StepResult r, host->WaitDecided(step));
      return r.skipped;
    };
  }
  h.gather = [this](int b) { return GatherBlock(b); };
  h.on_start = [this] {
    pipeline.streams->UseCompute();
  };  // the device current on the gather thread
  gather = std::make_unique<HostGather>(n, std::move(h));
  return OkStatus();
}

Status Trainer::Impl::WaitGathers() {
  return gather ? gather->WaitAll(static_cast<uint64_t>(completed)) : OkStatus();
}

// Block b's slices of every host into this rank's whole weights. Resident on CUDA, in place in
// the device's weights: this host's slice is uploaded into its part (rounded to the compute dtype
// on the way, as every upload of fp32 masters is: the same bits as rounding the gathered block),
// and the all-gather fills the rest, on the gather stream; the next forward's compute waits for
// that stream's event only. Streamed (and on a CPU device) into the pinned host copy the uploads
// read. The block's uses in the step just finished are over: its update waited for its gradients.
Status Trainer::Impl::GatherBlock(int b) {
  const c10::ScalarType host_dtype = host->weights_fp32() ? at::kFloat : dtype;
  const int64_t numel = static_cast<int64_t>(layout[b].numel);
  const int64_t padded = dp->Padded(numel);
  const int64_t chunk = padded / dp->world();
  const int64_t len = ShardLength(b);  // this rank's shard of its host's updated slice
  const at::Tensor slice = at::from_blob(host->compute_weights(b), {SliceLength(b)},
                                         at::TensorOptions().dtype(host_dtype))
                               .narrow(0, len > 0 ? ShardBegin(b) - SliceBegin(b) : 0, len);
  const std::string name = "gather " + model->block(b).name();
  if (!cuda) {
    at::Tensor shard = at::zeros({chunk}, host_dtype);
    if (len > 0) shard.narrow(0, 0, len).copy_(slice);
    at::Tensor all = at::empty({padded}, host_dtype);
    ASSIGN_OR_RETURN(DeviceStreams::EventPtr e,
                     pipeline.streams->OnGatherStream(
                         nullptr, [&] { return dp->AllGatherBlock(shard, all); }, name));
    (void)e;
    full_weights[b].copy_(all.narrow(0, 0, numel));
    pipeline.weights->OnUpdated(b);  // a 16-bit CPU compute's cast copy
    return OkStatus();
  }
  at::Tensor resident = pipeline.weights->ResidentWeights(b);
  const bool in_place = resident.defined() && padded == numel;
  at::Tensor all =
      in_place
          ? resident
          : at::empty(
                {padded},
                at::TensorOptions().dtype(resident.defined() ? dtype : host_dtype).device(device));
  at::Tensor shard = all.narrow(0, dp->rank() * chunk, chunk);
  DeviceStreams::EventPtr uploaded;
  if (len > 0) {
    at::Tensor mine = shard.narrow(0, 0, len);
    uploaded = pipeline.streams->CopyToDevice(mine, slice, "weights " + model->block(b).name(),
                                              /*after_compute=*/false);
  }
  ASSIGN_OR_RETURN(DeviceStreams::EventPtr gathered,
                   pipeline.streams->OnGatherStream(
                       uploaded,
                       [&]() -> Status {
                         if (len < chunk) shard.narrow(0, len, chunk - len).zero_();
                         RETURN_IF_ERROR(dp->AllGatherBlock(shard, all));
                         if (in_place) return OkStatus();
                         at::Tensor dst = resident.defined() ? resident : full_weights[b];
                         dst.copy_(all.narrow(0, 0, numel), /*non_blocking=*/true);
                         return OkStatus();
                       },
                       name));
  if (!in_place) pipeline.streams->ReleaseAfterCopies(all);
  if (resident.defined()) {
    pipeline.weights->SetReady(b, std::move(gathered));
    return OkStatus();
  }
  return DeviceStreams::Synchronize(gathered);  // the host copy is whole before an upload reads it
}

StatusOr<std::vector<at::Tensor>> Trainer::Impl::GatherMasters() {
  std::vector<at::Tensor> out(static_cast<size_t>(n));
  const auto opts = at::TensorOptions().dtype(at::kFloat).device(device);
  for (int b = 0; b < n; ++b) {
    const int64_t numel = static_cast<int64_t>(layout[b].numel);
    const int64_t padded = dp->Padded(numel);
    const int64_t len = ShardLength(b);
    at::Tensor slice = at::empty({SliceLength(b)}, at::kFloat);
    RETURN_IF_ERROR(host->ReadStates(b, slice.data_ptr<float>(), nullptr, nullptr));
    at::Tensor mine = at::zeros({padded / dp->world()}, at::kFloat);
    if (len > 0) mine.narrow(0, 0, len).copy_(slice.narrow(0, ShardBegin(b) - SliceBegin(b), len));
    at::Tensor shard = mine.to(device);
    at::Tensor all = at::empty({padded}, opts);
    RETURN_IF_ERROR(dp->AllGather(shard, all));
    out[b] = all.narrow(0, 0, numel).to(at::kCPU).contiguous();
  }
  return out;
}

// ---- checkpoints per partition ----

std::string Trainer::Impl::PartitionDir(int h) const {
  return cfg.output_dir + "/partition-" + std::to_string(h) + "-of-" +
         std::to_string(cfg.parallel.hosts);
}

std::string Trainer::Impl::PartitionFingerprint(int h) const {
  return Fingerprint() + "/partition " + std::to_string(h) + " of " +
         std::to_string(cfg.parallel.hosts);
}

Status Trainer::Impl::PublishPartition(int64_t step, const std::string& committed) {
  return dp->Set("partition/" + std::to_string(step) + "/" + std::to_string(host_index()),
                 committed);
}

// The store says that host h committed; its committed directory (offloadd_state.json, fsynced and
// renamed into place by CheckpointWriter::Commit) is the durable marker rank 0 checks. output_dir
// is shared by the hosts (as a cluster's job directory is), so rank 0 reads every partition's.
Status Trainer::Impl::AwaitPartitions(int64_t step) {
  const std::string name = "checkpoint-" + std::to_string(step);
  for (int h = 1; h < cfg.parallel.hosts; ++h) {
    const std::string which =
        name + ": partition " + std::to_string(h) + " of " + std::to_string(cfg.parallel.hosts);
    StatusOr<std::string> said =
        dp->Get("partition/" + std::to_string(step) + "/" + std::to_string(h));
    if (!said.ok()) {
      return Status(said.status().code(),
                    which + " was not reported committed: " + said.status().ToString());
    }
    const std::string path = PartitionDir(h) + "/" + name;
    StatusOr<CheckpointReader> r = CheckpointReader::Open(path, PartitionFingerprint(h));
    if (!r.ok()) {
      return FailedPreconditionError(
          which + " (" + path +
          ") is not committed where rank 0 sees it (output_dir must be shared by "
          "the hosts), so the checkpoint is not committed: " +
          r.status().ToString());
    }
  }
  return OkStatus();
}

Status Trainer::Impl::RestorePartition(const std::string& dir_in) {
  RETURN_IF_ERROR(Flush());
  RETURN_IF_ERROR(WaitGathers());  // the gathers read the slices the restore rewrites
  ASSIGN_OR_RETURN(const std::string mine, ResumePartition(cfg.parallel, dir_in));
  ASSIGN_OR_RETURN(CheckpointReader r,
                   CheckpointReader::Open(mine, PartitionFingerprint(host_index()),
                                          cfg.optim.state_dtype, cfg.optim.master_dtype));
  if (!host_leader()) return ResumeHostFollower(r, mine);
  if (r.num_layers() != n) {
    return FailedPreconditionError(mine + ": has " + std::to_string(r.num_layers()) +
                                   " layers, the model " + std::to_string(n));
  }
  std::vector<float> master, m, v;
  int64_t adam_steps = -1;
  for (int b = 0; b < n; ++b) {
    const int64_t len = SliceLength(b);
    master.resize(static_cast<size_t>(len));
    m.resize(static_cast<size_t>(len));
    v.resize(static_cast<size_t>(len));
    LayerTarget t;
    t.params = {ParamSpec{SliceName(b), {len}}};
    t.master = {std::span<float>(master)};
    t.exp_avg = {std::span<float>(m)};
    t.exp_avg_sq = {std::span<float>(v)};
    StatusOr<int64_t> adam_step = r.ReadLayer(b, t);
    if (!adam_step.ok()) return adam_step.status();
    if (adam_steps >= 0 && *adam_step != adam_steps) {
      return DataLossError(mine + ": layer " + std::to_string(b) + " has AdamW step " +
                           std::to_string(*adam_step) + ", layer 0 " + std::to_string(adam_steps));
    }
    adam_steps = *adam_step;
    RETURN_IF_ERROR(host->RestoreStates(b, master.data(), m.data(), v.data(),
                                        static_cast<uint64_t>(adam_steps)));
  }
  const TrainerState& st = r.state();
  if (adam_steps > st.global_step) {
    return DataLossError(mine + ": AdamW step " + std::to_string(adam_steps) +
                         " is beyond global_step " + std::to_string(st.global_step));
  }
  if (ranks_per_host() > 1) {  // the host's other ranks (ResumeHostFollower)
    RETURN_IF_ERROR(
        dp->Set("resume-adam-steps/" + std::to_string(host_index()), std::to_string(adam_steps)));
  }
  return ResumeAcross(st, adam_steps, mine);
}

// A host's other ranks: its leader restores the slice into the shared arena; this rank takes the
// step, the data position and the history from the partition.
Status Trainer::Impl::ResumeHostFollower(const CheckpointReader& r, const std::string& mine) {
  ASSIGN_OR_RETURN(const std::string applied,
                   dp->Get("resume-adam-steps/" + std::to_string(host_index())));
  return ResumeAcross(r.state(), std::stoll(applied), mine);
}

Status Trainer::Impl::ResumeAcross(const TrainerState& st, int64_t adam_steps,
                                   const std::string& mine) {
  RETURN_IF_ERROR(data->Restore(st.data_cursor));
  if (scaler && st.grad_scaler) RETURN_IF_ERROR(scaler->Restore(*st.grad_scaler));
  completed = st.global_step;
  pipeline.accounting->Restore(adam_steps, st.log_history);
  RETURN_IF_ERROR(
      host->ResumeAt(static_cast<uint64_t>(completed), static_cast<uint64_t>(adam_steps)));
  // Every host's restored slice into every rank's weights, before anything reads them.
  RETURN_IF_ERROR(gather->Submit(static_cast<uint64_t>(completed), /*restored=*/true));
  RETURN_IF_ERROR(gather->WaitAll(static_cast<uint64_t>(completed)));
  Log(TrainObserver::Level::kInfo, "rank " + std::to_string(dp->rank()) + " resumed from " + mine +
                                       " at step " + std::to_string(completed) + " of " +
                                       std::to_string(total));
  return OkStatus();
}

}  // namespace offloadd::trainer
