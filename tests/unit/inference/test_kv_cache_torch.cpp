// The paged KV cache: block accounting, waiting (not failing) when the pool is full, block
// tables, storage layout and no leaks over many sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "common/error.hpp"
#include "inference/kv_cache_torch.hpp"
#include "model/model_config.hpp"

namespace swarm {
namespace {

TEST(BlockAllocatorTest, FreshPoolHandsOutBlocksInOrder) {
  BlockAllocator a(8, 4);
  EXPECT_EQ(a.num_blocks(), 8);
  EXPECT_EQ(a.block_size(), 4);
  EXPECT_EQ(a.free_blocks(), 8);
  EXPECT_EQ(a.blocks_for(0), 0);
  EXPECT_EQ(a.blocks_for(1), 1);
  EXPECT_EQ(a.blocks_for(4), 1);
  EXPECT_EQ(a.blocks_for(5), 2);

  ASSERT_TRUE(a.ensure_capacity(7, 5));
  EXPECT_EQ(a.block_table(7), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(a.capacity(7), 8);
  EXPECT_EQ(a.free_blocks(), 6);
  EXPECT_TRUE(a.has_sequence(7));
  EXPECT_EQ(a.num_sequences(), 1);
}

TEST(BlockAllocatorTest, TablesGrowOnlyWhenNeeded) {
  BlockAllocator a(8, 4);
  ASSERT_TRUE(a.ensure_capacity(1, 1));
  EXPECT_EQ(a.block_table(1).size(), 1u);
  for (int64_t t = 2; t <= 4; ++t) {
    ASSERT_TRUE(a.ensure_capacity(1, t));
    EXPECT_EQ(a.block_table(1).size(), 1u) << t;
  }
  ASSERT_TRUE(a.ensure_capacity(2, 3));  // another sequence takes block 1
  ASSERT_TRUE(a.ensure_capacity(1, 5));  // sequence 1 grows into block 2
  EXPECT_EQ(a.block_table(1), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(a.block_table(2), (std::vector<int64_t>{1}));
  ASSERT_TRUE(a.ensure_capacity(1, 2));  // never shrinks
  EXPECT_EQ(a.block_table(1).size(), 2u);
  EXPECT_EQ(a.free_blocks(), 5);

  // slot_of maps positions through the table.
  EXPECT_EQ(a.slot_of(1, 0), 0 * 4 + 0);
  EXPECT_EQ(a.slot_of(1, 3), 0 * 4 + 3);
  EXPECT_EQ(a.slot_of(1, 4), 2 * 4 + 0);
  EXPECT_EQ(a.slot_of(1, 7), 2 * 4 + 3);
  EXPECT_EQ(a.slot_of(2, 2), 1 * 4 + 2);
  EXPECT_THROW(a.slot_of(1, 8), SwarmError);
  EXPECT_THROW(a.slot_of(99, 0), SwarmError);
}

TEST(BlockAllocatorTest, FullPoolSaysWaitThenFitsAfterRelease) {
  BlockAllocator a(4, 16);
  ASSERT_TRUE(a.ensure_capacity(0, 40));  // 3 blocks
  EXPECT_EQ(a.free_blocks(), 1);
  EXPECT_FALSE(a.can_fit(1, 17));
  EXPECT_FALSE(a.ensure_capacity(1, 17));  // needs 2: refused, nothing taken
  EXPECT_EQ(a.free_blocks(), 1);
  EXPECT_FALSE(a.has_sequence(1));
  EXPECT_FALSE(a.ensure_capacity(0, 65));  // growing past the pool is refused too
  EXPECT_EQ(a.block_table(0).size(), 3u);
  EXPECT_TRUE(a.ensure_capacity(1, 16));  // 1 block still fits
  EXPECT_EQ(a.free_blocks(), 0);
  EXPECT_FALSE(a.ensure_capacity(2, 1));

  a.release(0);
  EXPECT_EQ(a.free_blocks(), 3);
  EXPECT_FALSE(a.has_sequence(0));
  EXPECT_TRUE(a.block_table(0).empty());
  EXPECT_EQ(a.capacity(0), 0);
  EXPECT_TRUE(a.ensure_capacity(2, 48));
  EXPECT_EQ(a.free_blocks(), 0);
  a.release(12345);  // unknown slot: no-op
  EXPECT_EQ(a.free_blocks(), 0);
  EXPECT_THROW(a.ensure_capacity(3, -1), SwarmError);
}

TEST(BlockAllocatorTest, ZeroTokensRegistersWithoutBlocks) {
  BlockAllocator a(2, 8);
  ASSERT_TRUE(a.ensure_capacity(5, 0));
  EXPECT_TRUE(a.has_sequence(5));
  EXPECT_EQ(a.free_blocks(), 2);
  a.release(5);
  EXPECT_FALSE(a.has_sequence(5));
}

TEST(BlockAllocatorTest, RejectsEmptyPool) {
  EXPECT_THROW(BlockAllocator(0, 16), SwarmError);
  EXPECT_THROW(BlockAllocator(4, 0), SwarmError);
}

// Many sequences of random lengths come and go; blocks are never shared between live
// sequences, and once everything is released the whole pool is free again.
TEST(BlockAllocatorTest, NoLeakOrSharingOverManySequences) {
  BlockAllocator a(64, 8);
  std::mt19937 rng(1234);
  std::map<int64_t, int64_t> live;  // slot -> tokens
  int64_t next_slot = 0, refused = 0;
  for (int step = 0; step < 5000; ++step) {
    const int action = static_cast<int>(rng() % 3);
    if (action == 0 || live.empty()) {
      const int64_t tokens = 1 + static_cast<int64_t>(rng() % 100);
      if (a.ensure_capacity(next_slot, tokens)) {
        live[next_slot] = tokens;
      } else {
        ++refused;
        EXPECT_FALSE(a.has_sequence(next_slot));
      }
      ++next_slot;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      if (action == 1) {  // grow by one decode step
        if (a.ensure_capacity(it->first, it->second + 1)) ++it->second;
      } else {
        a.release(it->first);
        live.erase(it);
      }
    }
    int64_t used = 0;
    std::set<int64_t> seen;
    for (const auto& [slot, tokens] : live) {
      const auto& table = a.block_table(slot);
      ASSERT_EQ(static_cast<int64_t>(table.size()), a.blocks_for(tokens));
      for (int64_t b : table) {
        ASSERT_TRUE(b >= 0 && b < 64);
        ASSERT_TRUE(seen.insert(b).second) << "block " << b << " shared";
      }
      used += static_cast<int64_t>(table.size());
    }
    ASSERT_EQ(used + a.free_blocks(), 64);
    ASSERT_EQ(a.num_sequences(), static_cast<int64_t>(live.size()));
  }
  EXPECT_GT(refused, 0) << "the test should exercise a full pool";
  for (const auto& [slot, tokens] : live) a.release(slot);
  EXPECT_EQ(a.free_blocks(), 64);
  EXPECT_EQ(a.num_sequences(), 0);
}

TEST(KvCacheTest, StorageShapeBytesAndViews) {
  KvCache cache(/*layers=*/3, /*kv_heads=*/2, /*head_dim=*/8, /*blocks=*/5, /*block_size=*/4, torch::kFloat);
  EXPECT_EQ(cache.num_layers(), 3);
  EXPECT_EQ(cache.dtype(), torch::kFloat);
  EXPECT_EQ(cache.device(), torch::Device(torch::kCPU));
  EXPECT_EQ(cache.bytes(), 3 * 2 * 5 * 4 * 2 * 8 * 4);
  for (int64_t l = 0; l < 3; ++l) {
    EXPECT_EQ(cache.keys(l).sizes().vec(), (std::vector<int64_t>{5, 4, 2, 8}));
    EXPECT_EQ(cache.values(l).sizes().vec(), (std::vector<int64_t>{5, 4, 2, 8}));
    EXPECT_TRUE(cache.keys(l).is_contiguous());
    EXPECT_EQ(cache.keys(l).abs().sum().item<float>(), 0.0f);
  }
  // Layers and K/V are disjoint views of one pool.
  cache.keys(1).fill_(1.0f);
  cache.values(2)[3].fill_(2.0f);
  EXPECT_EQ(cache.keys(0).sum().item<float>(), 0.0f);
  EXPECT_EQ(cache.values(1).sum().item<float>(), 0.0f);
  EXPECT_EQ(cache.keys(1).sum().item<float>(), 5 * 4 * 2 * 8);
  EXPECT_EQ(cache.values(2).sum().item<float>(), 2.0f * 4 * 2 * 8);

  EXPECT_TRUE(cache.ensure_capacity(0, 20));
  EXPECT_EQ(cache.free_blocks(), 0);
  EXPECT_FALSE(cache.ensure_capacity(1, 1));
  cache.release(0);
  EXPECT_EQ(cache.free_blocks(), 5);
}

TEST(KvCacheTest, StepBuffersAreKeptWhileTheShapeStays) {
  KvCache cache(1, 1, 8, 2, 4, torch::kFloat);
  StepBuffers& kept = cache.step_buffers();
  EXPECT_EQ(kept.bytes(), 0);
  const torch::Tensor a = kept.get(0, {3, 5}, torch::kFloat, torch::kCPU);
  const torch::Tensor b = kept.get(2, {4}, torch::kLong, torch::kCPU);
  EXPECT_EQ(a.sizes().vec(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(b.scalar_type(), torch::kLong);
  EXPECT_EQ(kept.bytes(), 3 * 5 * 4 + 4 * 8);
  // The same shape and dtype: the same memory; another shape or dtype: a new tensor in its place.
  EXPECT_EQ(kept.get(0, {3, 5}, torch::kFloat, torch::kCPU).data_ptr(), a.data_ptr());
  const torch::Tensor c = kept.get(0, {2, 5}, torch::kFloat, torch::kCPU);
  EXPECT_EQ(c.sizes().vec(), (std::vector<int64_t>{2, 5}));
  const torch::Tensor d = kept.get(0, {2, 5}, torch::kBFloat16, torch::kCPU);
  EXPECT_EQ(d.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(kept.bytes(), 2 * 5 * 2 + 4 * 8);  // what is held is the latest of each slot
}

TEST(KvCacheTest, SizedForAModel) {
  ModelConfig c;
  c.num_hidden_layers = 2;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  const int64_t per_block = KvCache::bytes_per_block(c, 16, torch::kBFloat16);
  EXPECT_EQ(per_block, 2 * 2 * 16 * 4 * 16 * 2);
  KvCache cache = KvCache::for_model(c, 10, 16, torch::kBFloat16);
  EXPECT_EQ(cache.bytes(), 10 * per_block);
  EXPECT_EQ(cache.dtype(), torch::kBFloat16);
  EXPECT_EQ(cache.keys(1).sizes().vec(), (std::vector<int64_t>{10, 16, 4, 16}));
}

}  // namespace
}  // namespace swarm
