// The KV block accounting, without tensors: block tables, waiting (not failing) when the pool is
// full, no leaks over many sequences; and the prefix cache: keys by hash chain, matches checked
// against content, reference counts, least-recently-used eviction of unreferenced blocks,
// never of held ones, and forgetting everything when the weights change.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "common/error.hpp"
#include "inference/block_allocator.hpp"

namespace swarm {
namespace {

constexpr int64_t kBs = 4;

// The chain keys of the full blocks of `tokens` under `root`.
std::vector<uint64_t> chain(uint64_t root, const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> h;
  for (size_t i = 0; (i + 1) * kBs <= tokens.size(); ++i)
    h.push_back(kv_block_hash(i == 0 ? root : h.back(), tokens.data() + i * kBs, kBs));
  return h;
}

// Publishes every full block of `slot` (which holds `tokens`).
void publish_all(BlockAllocator& a, int64_t slot, uint64_t root, const std::vector<int32_t>& tokens) {
  const std::vector<uint64_t> h = chain(root, tokens);
  for (size_t i = 0; i < h.size(); ++i)
    a.publish(slot, static_cast<int64_t>(i), h[i], i == 0 ? root : h[i - 1], tokens.data() + i * kBs);
}

std::vector<int32_t> iota(int32_t from, int32_t n) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

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

TEST(PrefixKeys, DependOnEveryTokenThePrefixAndTheRoot) {
  const std::vector<int32_t> t = iota(0, 8);
  const uint64_t r0 = kv_chain_root(0), r1 = kv_chain_root(1);
  EXPECT_NE(r0, r1);
  const auto a = chain(r0, t);
  EXPECT_EQ(a, chain(r0, t));  // deterministic
  EXPECT_NE(a, chain(r1, t));  // another weights version: other keys
  std::vector<int32_t> u = t;
  u[1] = 99;  // the first block differs: so does every key after it
  const auto b = chain(r0, u);
  EXPECT_NE(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
  u = t;
  u[6] = 99;  // only the second block differs
  const auto c = chain(r0, u);
  EXPECT_EQ(a[0], c[0]);
  EXPECT_NE(a[1], c[1]);
}

TEST(PrefixCache, ASecondSequenceAttachesTheFirstsFullBlocks) {
  BlockAllocator a(16, kBs);
  const uint64_t root = kv_chain_root(7);
  const std::vector<int32_t> t = iota(10, 10);  // 2 full blocks + 2 tokens
  ASSERT_TRUE(a.ensure_capacity(1, 11));
  publish_all(a, 1, root, t);
  EXPECT_EQ(a.cached_blocks(), 2);
  EXPECT_EQ(a.evictable_blocks(), 0);  // held by sequence 1

  const auto h = chain(root, t);
  const std::vector<int64_t> hit = a.match(root, h, t.data(), 2);
  ASSERT_EQ(hit.size(), 2u);
  EXPECT_EQ(hit[0], a.block_table(1)[0]);
  EXPECT_EQ(hit[1], a.block_table(1)[1]);
  EXPECT_EQ(a.match(root, h, t.data(), 1).size(), 1u);  // at most max_blocks
  EXPECT_EQ(a.unreferenced(hit), 0);

  const int64_t free_before = a.free_blocks();
  ASSERT_TRUE(a.attach(2, hit, 11));  // 3 blocks: 2 shared + 1 new
  EXPECT_EQ(a.free_blocks(), free_before - 1);
  EXPECT_EQ(a.references(hit[0]), 2);
  EXPECT_EQ(a.block_table(2)[0], hit[0]);
  EXPECT_NE(a.block_table(2)[2], a.block_table(1)[2]);  // the partial block is its own
  EXPECT_THROW(a.attach(2, hit, 11), SwarmError);       // a slot attaches once

  // Released by both: the cached blocks stay findable (on the LRU list), the others are free.
  a.release(1);
  EXPECT_EQ(a.references(hit[0]), 1);
  a.release(2);
  EXPECT_EQ(a.evictable_blocks(), 2);
  EXPECT_EQ(a.free_blocks(), 16);  // cached unreferenced blocks count as free
  EXPECT_EQ(a.match(root, h, t.data(), 2), hit);
}

TEST(PrefixCache, AMatchNeedsTheSameTokensTheSameParentAndTheSameRoot) {
  BlockAllocator a(16, kBs);
  const uint64_t root = kv_chain_root(0);
  const std::vector<int32_t> t = iota(0, 8);
  ASSERT_TRUE(a.ensure_capacity(1, 8));
  publish_all(a, 1, root, t);
  a.release(1);
  const auto h = chain(root, t);
  EXPECT_EQ(a.match(root, h, t.data(), 2).size(), 2u);
  EXPECT_TRUE(a.match(kv_chain_root(1), chain(kv_chain_root(1), t), t.data(), 2).empty());
  // The right keys over other tokens (as a hash collision would give): refused.
  std::vector<int32_t> other = t;
  other[5] = 1000;
  EXPECT_EQ(a.match(root, h, other.data(), 2).size(), 1u);
  other[0] = 1000;
  EXPECT_TRUE(a.match(root, h, other.data(), 2).empty());
  // The right second key after a different first one: the parent check refuses it.
  std::vector<uint64_t> forged = {kv_block_hash(root, other.data(), kBs), h[1]};
  EXPECT_TRUE(a.match(root, forged, t.data(), 2).empty());
  EXPECT_TRUE(a.match(root, {h[1]}, t.data() + kBs, 1).empty());
}

TEST(PrefixCache, PublishingTheSameContentTwiceKeepsOneCachedCopy) {
  BlockAllocator a(16, kBs);
  const uint64_t root = kv_chain_root(0);
  const std::vector<int32_t> t = iota(0, 4);
  ASSERT_TRUE(a.ensure_capacity(1, 4));
  ASSERT_TRUE(a.ensure_capacity(2, 4));  // computed the same block in the same step
  const auto h = chain(root, t);
  EXPECT_TRUE(a.publish(1, 0, h[0], root, t.data()));
  EXPECT_FALSE(a.publish(2, 0, h[0], root, t.data()));  // stays private
  EXPECT_FALSE(a.publish(1, 0, h[0], root, t.data()));  // cached already
  EXPECT_EQ(a.cached_blocks(), 1);
  a.release(2);
  EXPECT_EQ(a.evictable_blocks(), 0);  // the private copy went back to the free list
  a.release(1);
  EXPECT_EQ(a.evictable_blocks(), 1);
}

TEST(PrefixCache, EvictionTakesTheLeastRecentlyUsedAndNeverAHeldBlock) {
  BlockAllocator a(6, kBs);
  const uint64_t root = kv_chain_root(0);
  const std::vector<int32_t> x = iota(0, 8), y = iota(100, 8);
  ASSERT_TRUE(a.ensure_capacity(1, 8));
  publish_all(a, 1, root, x);
  a.release(1);  // x's 2 blocks cached, unreferenced
  ASSERT_TRUE(a.ensure_capacity(2, 8));
  publish_all(a, 2, root, y);
  a.release(2);  // y's too, used later than x's
  EXPECT_EQ(a.evictable_blocks(), 4);
  EXPECT_EQ(a.free_blocks(), 6);

  // x is used again: it becomes the most recent.
  const auto hx = chain(root, x);
  const auto hit = a.match(root, hx, x.data(), 2);
  ASSERT_EQ(hit.size(), 2u);
  ASSERT_TRUE(a.attach(3, hit, 8));
  EXPECT_EQ(a.free_blocks(), 4);  // held blocks are not free
  a.release(3);

  // 3 new blocks: the 2 free ones, then y's last block (y's later block goes before its first).
  ASSERT_TRUE(a.ensure_capacity(4, 12));
  EXPECT_EQ(a.cached_blocks(), 3);
  const auto hy = chain(root, y);
  EXPECT_EQ(a.match(root, hy, y.data(), 2).size(), 1u);
  EXPECT_EQ(a.match(root, hx, x.data(), 2).size(), 2u);

  // x held: a request for more than what is free or unreferenced is refused, x untouched.
  ASSERT_TRUE(a.attach(5, a.match(root, hx, x.data(), 2), 8));
  EXPECT_EQ(a.free_blocks(), 1);  // y's first block
  EXPECT_FALSE(a.ensure_capacity(6, 8));
  EXPECT_TRUE(a.ensure_capacity(6, 4));  // takes y's first block
  EXPECT_TRUE(a.match(root, hy, y.data(), 2).empty());
  EXPECT_EQ(a.match(root, hx, x.data(), 2).size(), 2u);
  EXPECT_EQ(a.references(a.block_table(5)[0]), 1);
}

TEST(PrefixCache, AttachRefusesWhenTheRestDoesNotFitAndChangesNothing) {
  BlockAllocator a(4, kBs);
  const uint64_t root = kv_chain_root(0);
  const std::vector<int32_t> t = iota(0, 8);
  ASSERT_TRUE(a.ensure_capacity(1, 8));
  publish_all(a, 1, root, t);
  a.release(1);
  const auto hit = a.match(root, chain(root, t), t.data(), 2);
  ASSERT_EQ(hit.size(), 2u);
  ASSERT_TRUE(a.ensure_capacity(2, 4));         // 1 free block left besides the 2 cached
  EXPECT_FALSE(a.attach(3, hit, 8 + 2 * kBs));  // needs 2 more: refused
  EXPECT_FALSE(a.has_sequence(3));
  EXPECT_EQ(a.evictable_blocks(), 2);
  EXPECT_TRUE(a.attach(3, hit, 8 + kBs));  // needs 1 more: fits
  EXPECT_EQ(a.free_blocks(), 0);
}

TEST(PrefixCache, DroppingForgetsContentFreesUnheldAndPrivatisesHeldBlocks) {
  BlockAllocator a(8, kBs);
  const uint64_t root = kv_chain_root(0);
  const std::vector<int32_t> x = iota(0, 8), y = iota(50, 8);
  ASSERT_TRUE(a.ensure_capacity(1, 8));
  publish_all(a, 1, root, x);
  a.release(1);
  ASSERT_TRUE(a.ensure_capacity(2, 8));
  publish_all(a, 2, root, y);  // y still held
  a.drop_cached();
  EXPECT_EQ(a.cached_blocks(), 0);
  EXPECT_EQ(a.evictable_blocks(), 0);
  EXPECT_EQ(a.free_blocks(), 6);
  EXPECT_TRUE(a.match(root, chain(root, x), x.data(), 2).empty());
  EXPECT_TRUE(a.match(root, chain(root, y), y.data(), 2).empty());
  a.release(2);  // private now: straight back to the free list
  EXPECT_EQ(a.free_blocks(), 8);
  EXPECT_EQ(a.evictable_blocks(), 0);
}

// Random sequences over a few shared prefixes come and go through match / attach / publish /
// release: a held block is never handed to another sequence unless it is cached and matched,
// every match is the content it claims, and when all are released every block is free again.
TEST(PrefixCache, ReferenceCountsStayExactOverManySequences) {
  BlockAllocator a(48, kBs);
  std::mt19937 rng(99);
  const uint64_t root = kv_chain_root(3);
  std::vector<std::vector<int32_t>> prefixes;
  for (int p = 0; p < 4; ++p) prefixes.push_back(iota(1000 * p, 4 + 4 * p));
  std::map<int64_t, std::vector<int32_t>> live;  // slot -> tokens
  int64_t next = 0, attached_blocks = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 2 == 0) {
      std::vector<int32_t> t = prefixes[rng() % prefixes.size()];
      const int extra = 1 + static_cast<int>(rng() % 10);
      for (int i = 0; i < extra; ++i) t.push_back(static_cast<int32_t>(rng() % 7));
      const auto h = chain(root, t);
      const int64_t matchable = (static_cast<int64_t>(t.size()) - 1) / kBs;
      const auto hit = a.match(root, h, t.data(), matchable);
      if (!a.attach(next, hit, static_cast<int64_t>(t.size()) + 1)) {
        EXPECT_FALSE(a.has_sequence(next));
        ++next;
        continue;
      }
      attached_blocks += static_cast<int64_t>(hit.size());
      for (size_t i = hit.size(); i < h.size(); ++i)
        a.publish(next, static_cast<int64_t>(i), h[i], i == 0 ? root : h[i - 1], t.data() + i * kBs);
      live[next++] = t;
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      a.release(it->first);
      live.erase(it);
    }
    // References equal the number of live tables holding each block.
    std::map<int64_t, int64_t> holders;
    for (const auto& [slot, t] : live)
      for (int64_t b : a.block_table(slot)) ++holders[b];
    for (int64_t b = 0; b < a.num_blocks(); ++b) {
      const auto it = holders.find(b);
      ASSERT_EQ(a.references(b), it == holders.end() ? 0 : it->second) << "block " << b << " step " << step;
    }
    // A block shared by two live sequences holds the same tokens in both.
    for (const auto& [slot, t] : live) {
      const auto& table = a.block_table(slot);
      for (const auto& [other, u] : live) {
        if (other <= slot) continue;
        const auto& ot = a.block_table(other);
        for (size_t i = 0; i < std::min(table.size(), ot.size()); ++i) {
          if (table[i] != ot[i]) continue;
          ASSERT_TRUE(std::equal(t.begin() + i * kBs, t.begin() + (i + 1) * kBs, u.begin() + i * kBs))
              << "block " << table[i] << " shared by different content";
        }
      }
    }
  }
  EXPECT_GT(attached_blocks, 100);  // the prefixes were reused, not just allocated
  for (const auto& [slot, t] : live) a.release(slot);
  EXPECT_EQ(a.free_blocks(), a.num_blocks());
  EXPECT_EQ(a.num_sequences(), 0);
}

}  // namespace
}  // namespace swarm
