// The paged KV cache's storage: layout and views, step buffers, sizing for a model (the block
// accounting is tested in test_block_allocator.cpp).
#include <gtest/gtest.h>

#include "inference/kv_cache_torch.hpp"
#include "model/model_config.hpp"

namespace swarm {
namespace {

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
