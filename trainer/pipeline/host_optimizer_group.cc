// HostOptimizer in a data-parallel group (trainer/pipeline/group_link.h): rank 0's hand-off of a
// block waits for every rank's shard in the shared staging buffer, and publishes what the other
// ranks follow; a rank > 0 attaches to rank 0's arena, lands its shards there and follows the
// leader's updates (uploading each updated block as rank 0 does) and decisions.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "ipc/unique_fd.h"
#include "job/arena_layout.h"
#include "trainer/pipeline/group_link.h"
#include "trainer/pipeline/host_optimizer.h"
#include "trainer/pipeline/nvme_state_tier.h"

namespace offloadd::trainer {

// ---- rank 0 ----

std::string HostOptimizer::ArenaPath() const {
  return "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(segment_.fd());
}

void HostOptimizer::PublishBlocks() {
  for (size_t b = 0; b < shards_.size(); ++b) {
    GroupLink::BlockInfo info;
    info.num_elements = shards_[b].num_elements;
    info.grad_offset = shards_[b].grad_offset;
    info.master_offset = shards_[b].master_offset;
    if (!tier_) {  // the RAM tier: the other ranks can read the states (device blocks' start)
      info.exp_avg_offset = shards_[b].exp_avg_offset;
      info.exp_avg_sq_offset = shards_[b].exp_avg_sq_offset;
    }
    info.weights_offset = static_cast<uint64_t>(static_cast<uint8_t*>(compute_weights(static_cast<int>(b))) -
                                                arena_->base());
    options_.group->SetBlock(static_cast<int>(b), info);
  }
}

void HostOptimizer::PublishStagingFree(int block) {
  options_.group->PublishConsumed(block, handoffs_[block]);
}

Status HostOptimizer::WaitPeers(int block) {
  GroupLink& g = *options_.group;
  const uint64_t want = handoffs_[block] + 1;
  // The group's timeout (parallel.timeout_seconds), as every GroupLink wait.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(g.timeout_seconds() * 1000));
  while (!g.PeersArrived(block, want)) {
    RETURN_IF_ERROR(driver_->Poll());
    RETURN_IF_ERROR(g.aborted());
    if (std::chrono::steady_clock::now() > deadline) {
      char waited[32];
      std::snprintf(waited, sizeof waited, "%g", g.timeout_seconds());
      return Status(StatusCode::kDeadlineExceeded, std::string("rank 0 waited ") + waited +
                                                       " s (parallel timeout) for the other ranks' gradients of block " +
                                                       std::to_string(block));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return OkStatus();
}

// ---- ranks > 0 ----

Status HostOptimizer::StartFollower(const HostOptimizerOptions& o) {
  options_ = o;
  follower_ = true;
  GroupLink& g = *o.group;
  if (o.leader_arena_path.empty()) return InvalidArgumentError("rank " + std::to_string(g.rank()) + ": no arena to attach to");
  if (g.blocks() != static_cast<int>(o.block_elements.size())) {
    return FailedPreconditionError("rank 0's model has " + std::to_string(g.blocks()) + " blocks, rank " +
                                   std::to_string(g.rank()) + "'s " + std::to_string(o.block_elements.size()));
  }
  ipc::UniqueFd fd(open(o.leader_arena_path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    return UnavailableError("rank " + std::to_string(g.rank()) + " cannot open rank 0's arena " +
                            o.leader_arena_path + ": " + std::strerror(errno));
  }
  ASSIGN_OR_RETURN(segment_, ipc::SharedSegment::Attach(fd.get()));
  ASSIGN_OR_RETURN(ipc::Arena arena, ipc::Arena::Open(&segment_));
  arena_ = std::make_unique<ipc::Arena>(std::move(arena));
  const uint64_t grad_bytes = o.compute == HostDtype::kFp32 ? 4 : 2;
  weights_fp32_ = WeightsAreFp32(o);  // the leader's choice: the options are the same on every rank
  shards_.resize(o.block_elements.size());
  for (size_t b = 0; b < shards_.size(); ++b) {
    const GroupLink::BlockInfo info = g.block(static_cast<int>(b));
    if (info.num_elements != o.block_elements[b]) {
      return FailedPreconditionError("block " + std::to_string(b) + " has " + std::to_string(info.num_elements) +
                                     " parameters on rank 0, " + std::to_string(o.block_elements[b]) + " here");
    }
    RETURN_IF_ERROR(arena_->Check(info.grad_offset, info.num_elements * grad_bytes));
    const uint64_t weight_bytes = internal::BlockWeightsFp32(o, b) ? 4 : 2;  // as the leader's
    RETURN_IF_ERROR(arena_->Check(info.weights_offset, info.num_elements * weight_bytes));
    shards_[b].layer = static_cast<uint32_t>(b);
    shards_[b].num_elements = info.num_elements;
    shards_[b].grad_offset = info.grad_offset;
    shards_[b].weights_offset = info.weights_offset;
    shards_[b].master_offset = info.master_offset;
    shards_[b].exp_avg_offset = info.exp_avg_offset;
    shards_[b].exp_avg_sq_offset = info.exp_avg_sq_offset;
  }
  updated_step_.assign(shards_.size(), 0);
  staging_busy_.assign(shards_.size(), false);
  handoffs_.assign(shards_.size(), 0);
  landed_.assign(shards_.size(), 0);
  thread_ = std::thread([this] { FollowLoop(); });
  return OkStatus();
}

Status HostOptimizer::FollowerReadStates(int block, float* master, float* exp_avg, float* exp_avg_sq) {
  const auto& s = shards_[block];
  if (s.exp_avg_offset == 0) {
    return FailedPreconditionError("the optimizer states of block " + std::to_string(block) +
                                   " are in rank 0's NVMe store: only rank 0 reads them");
  }
  const uint64_t bytes = s.num_elements * 4;
  const uint64_t offsets[3] = {s.master_offset, s.exp_avg_offset, s.exp_avg_sq_offset};
  float* dst[3] = {master, exp_avg, exp_avg_sq};
  for (int k = 0; k < 3; ++k) {
    if (dst[k] == nullptr) continue;  // (the masters only: an export across hosts)
    RETURN_IF_ERROR(arena_->Check(offsets[k], bytes));
    std::memcpy(dst[k], arena_->At<void>(offsets[k]), bytes);
  }
  return OkStatus();
}

Status HostOptimizer::FollowUpdates() {
  GroupLink& g = *options_.group;
  for (int b = 0; b < num_blocks(); ++b) {
    const uint64_t u = g.updated(b);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (u <= updated_step_[b]) continue;
    }
    if (on_updated_) RETURN_IF_ERROR(on_updated_(b));  // the upload, as on rank 0
    std::lock_guard<std::mutex> lock(mu_);
    updated_step_[b] = std::max(updated_step_[b], u);
    cv_.notify_all();
  }
  return OkStatus();
}

// The follower's optimizer thread: lands each queued hand-off (its copy's wait, then the shard's
// arrival and norm for rank 0) and follows rank 0's updates.
void HostOptimizer::FollowLoop() {
  GroupLink& g = *options_.group;
  bool failed = false;
  for (;;) {
    const uint32_t seen = g.sequence();
    if (!failed) {
      Status st = FollowUpdates();
      if (st.ok()) st = g.aborted();
      if (!st.ok()) {
        Fail(st);
        failed = true;
      }
    }
    Item item;
    bool have = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      if (!queue_.empty() && !failed) {
        item = std::move(queue_.front());
        queue_.pop_front();
        have = true;
      }
    }
    if (!have) {
      g.SleepWhile(seen, 20);
      continue;
    }
    while (item.done && !item.done()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    Status st = item.fn ? item.fn() : OkStatus();
    if (!st.ok()) {
      Fail(st);
      failed = true;
      continue;
    }
    const double sq = item.sq_norm ? item.sq_norm() : 0.0;
    g.PublishArrived(item.block, ++landed_[item.block], sq);
  }
}

}  // namespace offloadd::trainer
