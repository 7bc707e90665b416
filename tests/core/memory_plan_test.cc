#include "core/memory_plan.h"

#include <gtest/gtest.h>

#include <random>

namespace pt {
namespace {

TEST(MemoryPlan, LiveBuffersNeverOverlap) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<BufferLife> lives;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      const int first = static_cast<int>(rng() % 20) - 1;
      const int last = first + static_cast<int>(rng() % 8);
      lives.push_back({"b" + std::to_string(i), 1 + static_cast<int64_t>(rng() % 5000), first, last});
    }
    const MemoryPlan plan = plan_memory(lives);
    for (int a = 0; a < n; ++a) {
      EXPECT_EQ(plan.offsets[a] % kArenaAlignment, 0);
      EXPECT_LE(plan.offsets[a] + lives[a].bytes, plan.arena_bytes);
      for (int b = a + 1; b < n; ++b) {
        const bool same_time = lives[a].first <= lives[b].last && lives[b].first <= lives[a].last;
        const bool same_space = plan.offsets[a] < plan.offsets[b] + lives[b].bytes &&
                                plan.offsets[b] < plan.offsets[a] + lives[a].bytes;
        EXPECT_FALSE(same_time && same_space) << "buffers " << a << " and " << b;
      }
    }
    EXPECT_GE(plan.arena_bytes, plan.peak_live_bytes);
  }
}

TEST(MemoryPlan, ReusesMemoryOfDeadBuffers) {
  // A chain a -> b -> c -> d: at most two live at once, so two slots suffice.
  std::vector<BufferLife> chain = {{"a", 1024, 0, 1}, {"b", 1024, 1, 2}, {"c", 1024, 2, 3}, {"d", 1024, 3, 4}};
  const MemoryPlan plan = plan_memory(chain);
  EXPECT_EQ(plan.arena_bytes, 2048);
  EXPECT_EQ(plan.peak_live_bytes, 2048);
}

// Scratch placed after the tensors: the tensors keep their offsets, a scratch buffer takes a gap
// free during its step (b's place, dead at step 3) or goes on top.
TEST(MemoryPlan, AddedBuffersLeaveThePlacedOnesWhereTheyAre) {
  MemoryPlan plan = plan_memory({{"a", 1024, 0, 4}, {"b", 1024, 0, 2}});
  const std::vector<int64_t> before = plan.offsets;
  add_buffers(plan, {{"s3", 512, 3, 3}, {"s1", 256, 1, 1}});
  ASSERT_EQ(plan.offsets.size(), 4u);
  EXPECT_EQ(plan.offsets[0], before[0]);
  EXPECT_EQ(plan.offsets[1], before[1]);
  EXPECT_EQ(plan.offsets[2], before[1]);  // s3 where b was
  EXPECT_EQ(plan.offsets[3], 2048);       // s1 above a and b
  EXPECT_EQ(plan.arena_bytes, 2048 + 256);
  EXPECT_EQ(plan.peak_live_bytes, 2048 + 256);
}

// A buffer of no bytes (an output its caller places) takes no room.
TEST(MemoryPlan, ABufferOfNoBytesTakesNoRoom) {
  const MemoryPlan plan = plan_memory({{"placed", 0, 0, 3}, {"t", 1024, 1, 2}, {"u", 1024, 2, 3}});
  EXPECT_EQ(plan.arena_bytes, 2048);
}

}  // namespace
}  // namespace pt
