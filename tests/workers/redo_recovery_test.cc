// RecoverUndoSlots over hand-written redo slots: a committing slot is rolled forward, and a slot
// whose counter or destination lies in the redo region itself is refused as corrupt (found by
// the worker_protocol fuzzer: the copy overlapped its own source, ASan memcpy-param-overlap).
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/arena.h"
#include "ipc/shm_segment.h"
#include "workers/protocol.h"
#include "workers/shard_executor.h"

namespace offloadd::workers {
namespace {

// The slot header's layout (shard_executor.cc's UndoSlot), written byte by byte as a crashed
// worker would have left it in shared memory.
constexpr size_t kState = 0, kArrays = 4, kCounter = 8, kSeq = 16, kCount = 24, kDst = 32,
                 kBytes = 80, kData = 128;
constexpr uint32_t kCommitting = 1;

class RedoRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto seg = ipc::SharedSegment::Create(4 << 20);
    ASSERT_TRUE(seg.ok());
    seg_ = std::move(*seg);
    auto arena = ipc::Arena::Format(&seg_);
    ASSERT_TRUE(arena.ok());
    arena_ = *arena;
    undo_ = arena_.Allocate("worker0.undo", ipc::RegionKind::kControl, UndoRegionBytes(2))->offset;
    master_ = arena_.Allocate("master", ipc::RegionKind::kMaster, kChunkElements * sizeof(float))->offset;
    counter_ = arena_.Allocate("counters", ipc::RegionKind::kControl, 64)->offset;
  }
  uint8_t* Slot(uint32_t t) { return arena_.At<uint8_t>(undo_) + t * (UndoRegionBytes(2) / 2); }
  void Put64(uint8_t* slot, size_t at, uint64_t v) { std::memcpy(slot + at, &v, 8); }
  // Slot 0 commits one array of `count` elements (value 7.5) to `dst`, counter at `counter`.
  void WriteSlot(uint64_t dst, uint64_t counter, uint64_t count = 256) {
    uint8_t* s = Slot(0);
    const uint32_t state = kCommitting, arrays = 1;
    std::memcpy(s + kState, &state, 4);
    std::memcpy(s + kArrays, &arrays, 4);
    Put64(s, kCounter, counter);
    Put64(s, kSeq, 5);
    Put64(s, kCount, count);
    Put64(s, kDst, dst);
    const auto bytes = static_cast<uint32_t>(count * sizeof(float));
    std::memcpy(s + kBytes, &bytes, 4);
    std::vector<float> data(count, 7.5f);
    std::memcpy(s + kData, data.data(), count * sizeof(float));
  }

  ipc::SharedSegment seg_;
  ipc::Arena arena_;
  uint64_t undo_ = 0, master_ = 0, counter_ = 0;
};

TEST_F(RedoRecoveryTest, ACommittingSlotIsRolledForward) {
  WriteSlot(master_, counter_);
  auto done = RecoverUndoSlots(arena_, undo_, 2);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(*done, 1u);
  EXPECT_EQ(arena_.At<float>(master_)[255], 7.5f);
  EXPECT_EQ(arena_.At<float>(master_)[256], 0.0f);
  EXPECT_EQ(*arena_.At<uint64_t>(counter_), 5u);
}

TEST_F(RedoRecoveryTest, ADestinationInsideTheRedoRegionIsCorrupt) {
  // Onto its own data (the copy would overlap its source), and onto the other thread's slot.
  for (const uint64_t dst : {undo_ + kData + 64, undo_ + UndoRegionBytes(2) / 2 + kData}) {
    WriteSlot(dst, counter_);
    auto done = RecoverUndoSlots(arena_, undo_, 2);
    ASSERT_FALSE(done.ok()) << dst;
    EXPECT_EQ(done.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(done.status().message().find("would be copied into the undo region"), std::string::npos)
        << done.status().ToString();
    EXPECT_EQ(*arena_.At<uint64_t>(counter_), 0u) << "nothing committed";
  }
}

TEST_F(RedoRecoveryTest, ACounterInsideTheRedoRegionIsCorrupt) {
  WriteSlot(master_, undo_ + kSeq);
  auto done = RecoverUndoSlots(arena_, undo_, 2);
  ASSERT_FALSE(done.ok());
  EXPECT_EQ(done.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(done.status().message().find("counter lies in the undo region"), std::string::npos)
      << done.status().ToString();
  EXPECT_EQ(arena_.At<float>(master_)[0], 0.0f) << "nothing copied";
}

}  // namespace
}  // namespace offloadd::workers
