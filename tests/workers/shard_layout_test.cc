#include "workers/shard_layout.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace offloadd::workers {
namespace {

std::string WorkerBinary() {
  if (const char* dir = std::getenv("OFFLOADD_BINARY_DIR")) {
    return std::string(dir) + "/workers/offloadd-worker";
  }
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
          "../../workers/offloadd-worker")
      .string();
}

TEST(ShardLayoutTest, SplitsLayersIntoChunkAlignedShards) {
  auto seg = ipc::SharedSegment::Create(8 << 20);
  ASSERT_TRUE(seg.ok());
  auto arena = ipc::Arena::Format(&*seg);
  ASSERT_TRUE(arena.ok());
  const ShardLayoutOptions o{.max_shard_elements = 3000};  // rounds up to 4096
  auto shards = AllocateShards(&*arena, {10'000, 100}, o, 2);
  ASSERT_TRUE(shards.ok()) << shards.status().ToString();
  ASSERT_EQ(shards->size(), 4u);
  EXPECT_EQ((*shards)[0].num_elements, 4096u);
  EXPECT_EQ((*shards)[2].num_elements, 10'000u - 8192u);
  EXPECT_EQ((*shards)[3].layer, 1u);
  EXPECT_EQ((*shards)[3].worker, 1);
  EXPECT_TRUE(arena->Find("L0.S2.exp_avg_sq").ok());
  EXPECT_EQ(arena->Find("L0.S0.accum").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(AllocateShards(&*arena, {0}, {}, 1).status().code(), StatusCode::kInvalidArgument);
}

// ArenaBytesFor/RegionsFor are enough for the shards and a running pool, and not wasteful.
TEST(ShardLayoutTest, SizesTheSegmentFromThePlan) {
  const std::vector<uint64_t> layers = {123'457, 2'048, 1, 77'777};
  for (uint32_t accumulation : {1u, 4u}) {
    const ShardLayoutOptions o{.accumulation_steps = accumulation, .max_shard_elements = 50'000};
    WorkerPoolOptions po;
    po.worker_binary = WorkerBinary();
    po.processes = 2;
    po.threads_per_process = 2;
    const uint64_t bytes = ArenaBytesFor(layers, o, po);
    auto seg = ipc::SharedSegment::Create(bytes);
    ASSERT_TRUE(seg.ok());
    auto arena = ipc::Arena::Format(&*seg, {.max_regions = RegionsFor(layers, o, po.processes)});
    ASSERT_TRUE(arena.ok()) << arena.status().ToString();
    auto shards = AllocateShards(&*arena, layers, o, po.processes);
    ASSERT_TRUE(shards.ok()) << shards.status().ToString();
    auto pool = WorkerPool::Start(&*seg, &*arena, po);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    EXPECT_GE((*pool)->NumaNodeOf(0), 0);
    EXPECT_TRUE(BindShardsToWorkers(*arena, *shards, **pool).ok());
    const ipc::ArenaStats stats = arena->Stats();
    EXPECT_LE(stats.used_bytes, stats.capacity_bytes);
    EXPECT_GE(stats.used_bytes + (1u << 20), bytes - 2 * 4096) << "estimate far above the need";
  }
}

// Without a 16-bit copy (the device casts the fp32 masters) a shard has no weights region and
// the arena is 14 bytes per bf16 parameter, not 16; BytesPerParameter prices every layout.
TEST(ShardLayoutTest, NoWeightCopySavesTwoBytesPerParameter) {
  const std::vector<uint64_t> layers = {1 << 20, 1 << 19};  // whole pages: no rounding
  const uint64_t params = 3 << 19;
  ShardLayoutOptions copy;
  ShardLayoutOptions none{.weight_dtype = WeightDtype::kNone};
  EXPECT_EQ(BytesPerParameter(copy), 16u);
  EXPECT_EQ(BytesPerParameter(none), 14u);
  EXPECT_EQ(BytesPerParameter({.grad_dtype = GradDtype::kFp32, .weight_dtype = WeightDtype::kNone}),
            16u);
  EXPECT_EQ(BytesPerParameter({.accumulation_steps = 2}), 20u);
  EXPECT_EQ(BytesPerParameter({.weight_dtype = WeightDtype::kNone, .states_resident = false}), 2u);
  WorkerPoolOptions po;
  const uint64_t with = ArenaBytesFor(layers, copy, po), without = ArenaBytesFor(layers, none, po);
  EXPECT_EQ(with - without, 2 * params);
  // Beyond the per-parameter bytes: counters (1/128 B per parameter), rounding, rings, table.
  EXPECT_LE(without, params * 14 + params / 128 + (4u << 20));
  EXPECT_GE(without, params * 14);
  auto seg = ipc::SharedSegment::Create(without);
  ASSERT_TRUE(seg.ok());
  auto arena = ipc::Arena::Format(&*seg, {.max_regions = RegionsFor(layers, none, 1)});
  ASSERT_TRUE(arena.ok());
  auto shards = AllocateShards(&*arena, layers, none, 1);
  ASSERT_TRUE(shards.ok()) << shards.status().ToString();
  EXPECT_EQ((*shards)[0].weights_offset, 0u);
  EXPECT_EQ((*shards)[0].weight_dtype, WeightDtype::kNone);
  EXPECT_EQ(arena->Find("L0.S0.weights").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(arena->Stats().bytes_by_kind[static_cast<size_t>(ipc::RegionKind::kParamStaging)], 0u);
}

}  // namespace
}  // namespace offloadd::workers
