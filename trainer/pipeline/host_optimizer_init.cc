// HostOptimizer::InitializePieces: the initial fp32 master weights written into the arena in
// pieces on several threads at once, each piece's 16-bit copy for the device derived from it
// (a 7B model's 27 GB of masters were written on one thread); and the arena's
// population in the background that the pieces wait on (StartPopulation, WaitPopulated).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "job/arena_layout.h"
#include "trainer/pipeline/group_link.h"
#include "trainer/pipeline/host_optimizer.h"
#include "trainer/pipeline/nvme_state_tier.h"

namespace offloadd::trainer {

Status HostOptimizer::InitializePieces(const std::vector<InitPiece>& pieces,
                                       const std::function<Status(const InitPiece&, float*)>& fill,
                                       uint32_t threads) {
  if (follower_) return options_.group->WaitInitialized(1);
  std::vector<uint64_t> covered(shards_.size(), 0);
  for (const InitPiece& p : pieces) {
    if (p.block < 0 || p.block >= num_blocks() ||
        p.begin + p.count > shards_[p.block].num_elements) {
      return InvalidArgumentError("initial-value piece [" + std::to_string(p.begin) + ", " +
                                  std::to_string(p.begin + p.count) + ") of block " +
                                  std::to_string(p.block) + " is outside it");
    }
    covered[p.block] += p.count;
  }
  for (size_t b = 0; b < shards_.size(); ++b) {
    if (covered[b] != shards_[b].num_elements) {
      return InvalidArgumentError("initial-value pieces cover " + std::to_string(covered[b]) +
                                  " of block " + std::to_string(b) + "'s " +
                                  std::to_string(shards_[b].num_elements) + " elements");
    }
  }
  std::vector<InitPiece> ram_pieces;  // on the threads below
  for (const InitPiece& p : pieces) {
    if (!OnNvme(static_cast<size_t>(p.block))) ram_pieces.push_back(p);
  }
  // Blocks whose states are on NVMe: one staged block at a time, its pieces in order, on the
  // optimizer thread, written to the store (the others' go into the arena below, on threads).
  for (size_t b = 0; tier_ && b < shards_.size(); ++b) {
    if (!OnNvme(b)) continue;
    const Status staged = RunOnThread([&, b]() -> Status {
      return tier_->InitializeBlock(b, [&](float* master) -> Status {
        for (const InitPiece& p : pieces) {
          if (p.block == static_cast<int>(b)) RETURN_IF_ERROR(fill(p, master + p.begin));
        }
        return OkStatus();
      });
    });
    RETURN_IF_ERROR(staged);
  }
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error;
  auto run = [&] {
    for (size_t i = next++; i < ram_pieces.size(); i = next++) {
      const InitPiece& p = ram_pieces[i];
      const auto& s = shards_[p.block];
      if (population_) {  // the block's pages first (a write would fault them in one at a time)
        if (Status st = population_->WaitGate(static_cast<size_t>(p.block)); !st.ok()) {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error.ok()) first_error = st;
          next = ram_pieces.size();
          return;
        }
      }
      if (options_.mode.master == workers::MasterDtype::kBf16) {  // filled in fp32, then rounded
        std::vector<float> scratch(p.count);
        Status st = fill(p, scratch.data());
        if (st.ok()) {
          EncodeMaster(static_cast<size_t>(p.block), p.begin, scratch.data(), p.count);
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = st;
        next = ram_pieces.size();
        return;
      }
      float* master = arena_->At<float>(s.master_offset) + p.begin;
      Status st = fill(p, master);
      if (st.ok() && s.weights_offset != 0)
        internal::To16(options_.compute, master, arena_->At<uint16_t>(s.weights_offset) + p.begin,
                       p.count);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = st;
        next = ram_pieces.size();  // stop handing out pieces
      }
    }
  };
  std::vector<std::thread> pool;
  const uint32_t n =
      std::max<uint32_t>(1, std::min<uint32_t>(threads, static_cast<uint32_t>(ram_pieces.size())));
  for (uint32_t t = 1; t < n; ++t) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
  RETURN_IF_ERROR(first_error);
  if (options_.group) options_.group->PublishInitialized(1);
  return OkStatus();
}

Status HostOptimizer::StartPopulation() {
  // Gates 0..n-1: block b's masters and 16-bit weights (what InitializePieces writes); gate n:
  // every gradient staging buffer (what the device set-up page-locks); then the rest.
  ArenaPopulationOptions po;
  po.base = segment_.base();
  po.size = segment_.total_size();
  po.threads = options_.populate_threads;
  po.before_chunk = options_.populate_hook;
  const uint64_t grad_bytes = options_.compute == HostDtype::kFp32 ? 4 : 2;
  std::vector<ByteRange> staging;
  for (const workers::ShardSpec& s : shards_) {
    const uint64_t n = s.num_elements;
    std::vector<ByteRange> gate = {
        {s.master_offset, s.master_offset + workers::MasterRegionBytes(s.mode.master, n)}};
    if (s.weights_offset != 0) gate.push_back({s.weights_offset, s.weights_offset + n * 2});
    po.gates.push_back(std::move(gate));
    staging.push_back({s.grad_offset, s.grad_offset + n * grad_bytes});
  }
  po.gates.push_back(std::move(staging));
  ASSIGN_OR_RETURN(population_, ArenaPopulation::Start(std::move(po)));
  return OkStatus();
}

Status HostOptimizer::WaitPopulated() {
  if (!population_) return OkStatus();
  RETURN_IF_ERROR(population_->Finish());
  arena_end_ = population_->end_time();
  arena_seconds_ = std::chrono::duration<double>(arena_end_ - arena_start_).count();
  population_.reset();
  return OkStatus();
}

}  // namespace offloadd::trainer
