// The token sampler: greedy, per-sequence determinism and batch independence, top-k / top-p,
// empirical frequencies against softmax(logits / T), reported logprobs and masked tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include <c10/core/InferenceMode.h>

#include "common/error.hpp"
#include "inference/sampler_torch.hpp"

namespace swarm {
namespace {

at::Tensor row_logits(const std::vector<float>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kFloat)).view({1, static_cast<int64_t>(v.size())});
}

SampledToken sample_one(const at::Tensor& logits, const SamplingConfig& cfg, SamplerRng& rng) {
  std::vector<SamplingConfig> cfgs{cfg};
  std::vector<SamplerRng*> rngs{&rng};
  return sample_tokens(logits, cfgs, rngs).at(0);
}

SamplingConfig temp(double t) {
  SamplingConfig c;
  c.temperature = t;
  return c;
}

// Frequencies of `n_draws` draws of one row (replicated into batches of 1000 sharing one rng).
std::vector<double> frequencies(const std::vector<float>& v, const SamplingConfig& cfg, uint64_t seed,
                                int64_t n_draws) {
  const int64_t batch = 1000;
  SamplerRng rng(seed);
  const at::Tensor logits = row_logits(v).expand({batch, static_cast<int64_t>(v.size())});
  std::vector<SamplingConfig> cfgs(batch, cfg);
  std::vector<SamplerRng*> rngs(batch, &rng);
  std::vector<double> counts(v.size(), 0.0);
  for (int64_t done = 0; done < n_draws; done += batch)
    for (const auto& t : sample_tokens(logits, cfgs, rngs)) counts.at(static_cast<size_t>(t.id)) += 1;
  for (auto& c : counts) c /= static_cast<double>(n_draws);
  return counts;
}

const std::vector<float> kLogits = {1.0f, 2.5f, 0.3f, -1.0f, 2.0f, 0.0f};

TEST(SamplerRngTest, SameSeedSameStreamDifferentSeedDifferent) {
  SamplerRng a(42), b(42), c(43);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const double x = a.uniform();
    EXPECT_EQ(x, b.uniform());
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
    if (x != c.uniform()) differs = true;
  }
  EXPECT_TRUE(differs);
  SamplerRng copy = a;  // copyable: a copy continues the same stream
  EXPECT_EQ(copy.uniform(), a.uniform());
}

TEST(SamplerTest, GreedyPicksArgmaxWithLogSoftmaxLogprob) {
  const at::Tensor logits = at::tensor({0.1f, 3.0f, -2.0f, 2.9f, 1.0f, 0.5f, 4.0f, 0.0f}).view({2, 4});
  std::vector<SamplingConfig> cfgs{temp(0.0), temp(0.0)};
  SamplerRng r0(1), r1(2);
  std::vector<SamplerRng*> rngs{&r0, &r1};
  const auto out = sample_tokens(logits, cfgs, rngs);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].id, 1);
  EXPECT_EQ(out[1].id, 2);
  const at::Tensor lp = at::log_softmax(logits, 1);
  EXPECT_FLOAT_EQ(out[0].logprob, lp[0][1].item<float>());
  EXPECT_FLOAT_EQ(out[1].logprob, lp[1][2].item<float>());
  // Ties: the lowest id.
  SamplerRng r2(3);
  EXPECT_EQ(sample_one(row_logits({1.0f, 3.0f, 3.0f, 0.0f}), temp(0.0), r2).id, 1);
  // Greedy does not consume the rng.
  SamplerRng fresh(1);
  EXPECT_EQ(r0.uniform(), fresh.uniform());
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferent) {
  const at::Tensor logits = row_logits(kLogits);
  SamplerRng a(7), b(7), c(8);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    ta.push_back(sample_one(logits, temp(1.0), a).id);
    tb.push_back(sample_one(logits, temp(1.0), b).id);
    tc.push_back(sample_one(logits, temp(1.0), c).id);
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, IndependentOfBatchComposition) {
  const int64_t V = 50;
  const at::Tensor batch_logits = at::randn({4, V}, at::TensorOptions().dtype(at::kFloat));
  std::vector<SamplingConfig> cfgs(4);
  cfgs[0] = temp(0.8);
  cfgs[0].top_p = 0.9;
  cfgs[0].top_logprobs = 3;
  cfgs[1] = temp(0.0);
  cfgs[2] = temp(1.5);
  cfgs[2].top_k = 5;
  cfgs[3] = temp(1.0);
  for (int step = 0; step < 20; ++step) {
    SamplerRng alone(100 + step);
    const auto solo = sample_one(batch_logits.slice(0, 2, 3), cfgs[2], alone);
    SamplerRng r0(1 + step), r1(2 + step), r2(100 + step), r3(3 + step);
    std::vector<SamplerRng*> rngs{&r0, &r1, &r2, &r3};
    const auto out = sample_tokens(batch_logits, cfgs, rngs);
    EXPECT_EQ(out[2].id, solo.id);
    EXPECT_EQ(out[2].logprob, solo.logprob);
    EXPECT_EQ(r2.uniform(), alone.uniform());  // same number of draws consumed
  }
}

TEST(SamplerTest, TopKOneAndTinyTopPEqualGreedy) {
  for (int trial = 0; trial < 20; ++trial) {
    const at::Tensor logits = at::randn({1, 40}, at::TensorOptions().dtype(at::kFloat));
    const int64_t best = at::argmax(logits, 1).item<int64_t>();
    SamplerRng rng(trial);
    SamplingConfig k1 = temp(1.3);
    k1.top_k = 1;
    EXPECT_EQ(sample_one(logits, k1, rng).id, best);
    SamplingConfig p0 = temp(0.7);
    p0.top_p = 1e-6;
    EXPECT_EQ(sample_one(logits, p0, rng).id, best);
  }
}

// Each frequency is a mean of 20000 Bernoulli draws: its standard deviation is at most
// sqrt(0.25 / 20000) ~= 0.0035, so 0.01 is ~2.8 sigma for the worst category (the seed is fixed,
// so the test is deterministic; the bound guards against a wrong distribution, whose errors are
// an order of magnitude larger).
void expect_matches_softmax(double T, int64_t top_k) {
  SamplingConfig cfg = temp(T);
  cfg.top_k = top_k;
  const auto freq = frequencies(kLogits, cfg, 1234 + static_cast<uint64_t>(T * 10) + top_k, 20000);
  at::Tensor scaled = row_logits(kLogits) / T;
  if (top_k > 0) {
    const auto kth = std::get<0>(at::topk(scaled, top_k, 1)).select(1, top_k - 1).item<float>();
    scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<float>::infinity());
  }
  const at::Tensor p = at::softmax(scaled, 1);
  for (size_t i = 0; i < kLogits.size(); ++i) {
    const double expected = p[0][static_cast<int64_t>(i)].item<float>();
    EXPECT_NEAR(freq[i], expected, 0.01) << "T=" << T << " top_k=" << top_k << " id=" << i;
    if (expected == 0.0) {
      EXPECT_EQ(freq[i], 0.0) << "id " << i << " outside the top-k appeared";
    }
  }
}

// A straightforward reference of the documented rule: full sort (descending, ties by lower
// id), top-k, renormalise, top-p nucleus, inverse CDF with one uniform draw; in id order when
// nothing is truncated.
int32_t reference_draw(const at::Tensor& row_logits_1v, const SamplingConfig& cfg, double u) {
  const at::Tensor lp = at::log_softmax(row_logits_1v / cfg.temperature, 1).contiguous();
  const float* row = lp.data_ptr<float>();
  const int64_t V = lp.size(1);
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < V; ++i)
    if (std::isfinite(row[i])) ids.push_back(i);
  const bool truncates = (cfg.top_k > 0 && cfg.top_k < static_cast<int64_t>(ids.size())) || cfg.top_p < 1.0;
  if (truncates)
    std::sort(ids.begin(), ids.end(),
              [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  if (cfg.top_k > 0 && cfg.top_k < static_cast<int64_t>(ids.size())) ids.resize(cfg.top_k);
  std::vector<double> p;
  double total = 0;
  for (int32_t id : ids) total += std::exp(static_cast<double>(row[id]));
  size_t kept = ids.size();
  if (cfg.top_p < 1.0) {
    double c = 0;
    for (size_t j = 0; j < ids.size(); ++j) {
      c += std::exp(static_cast<double>(row[ids[j]]));
      if (c >= cfg.top_p * total) {
        kept = j + 1;
        break;
      }
    }
  }
  double mass = 0;
  for (size_t j = 0; j < kept; ++j) mass += std::exp(static_cast<double>(row[ids[j]]));
  const double target = u * mass;
  double c = 0;
  for (size_t j = 0; j < kept; ++j) {
    c += std::exp(static_cast<double>(row[ids[j]]));
    if (c > target) return ids[j];
  }
  return ids[kept - 1];
}

TEST(SamplerTest, MatchesReferenceInverseCdfOverSortedDescending) {
  int mismatches = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t V = trial % 3 == 0 ? 3000 : 37;
    const at::Tensor logits = at::randn({1, V}, at::TensorOptions().dtype(at::kFloat)) * 2.0;
    SamplingConfig cfg;
    cfg.temperature = 0.3 + (trial % 7) * 0.3;
    cfg.top_p = trial % 2 ? 1.0 : 0.2 + (trial % 5) * 0.2;
    cfg.top_k = trial % 4 == 1 ? 1 + trial % 20 : -1;
    SamplerRng rng(static_cast<uint64_t>(trial) * 977);
    SamplerRng peek = rng;
    const double u = peek.uniform();
    const int32_t got = sample_one(logits, cfg, rng).id;
    if (got != reference_draw(logits, cfg, u)) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(SamplerTest, FrequenciesMatchSoftmaxT1) { expect_matches_softmax(1.0, -1); }
TEST(SamplerTest, FrequenciesMatchSoftmaxTHalf) { expect_matches_softmax(0.5, -1); }
TEST(SamplerTest, FrequenciesTopK3Renormalised) { expect_matches_softmax(1.0, 3); }

TEST(SamplerTest, TopPKeepsNucleusOnly) {
  // softmax(kLogits) sorted: id1 .487, id4 .296, id0 .109, ... -> top_p 0.6 keeps {1, 4}.
  SamplingConfig cfg = temp(1.0);
  cfg.top_p = 0.6;
  const auto freq = frequencies(kLogits, cfg, 99, 10000);
  const at::Tensor p = at::softmax(row_logits(kLogits), 1);
  const double p1 = p[0][1].item<float>(), p4 = p[0][4].item<float>();
  EXPECT_NEAR(freq[1], p1 / (p1 + p4), 0.015);
  EXPECT_NEAR(freq[4], p4 / (p1 + p4), 0.015);
  EXPECT_DOUBLE_EQ(freq[1] + freq[4], 1.0);
}

TEST(SamplerTest, LogprobsAndTopListFromScaledUntruncatedDistribution) {
  const at::Tensor logits = at::randn({3, 30}, at::TensorOptions().dtype(at::kFloat));
  const std::vector<double> temps{1.0, 0.5, 2.0};
  std::vector<SamplingConfig> cfgs(3);
  for (size_t b = 0; b < 3; ++b) {
    cfgs[b] = temp(temps[b]);
    cfgs[b].top_logprobs = static_cast<int64_t>(b) * 5 + 1;
    cfgs[b].top_k = 4;  // truncation must not change the reported logprobs
  }
  SamplerRng r0(1), r1(2), r2(3);
  std::vector<SamplerRng*> rngs{&r0, &r1, &r2};
  for (int step = 0; step < 10; ++step) {
    const auto out = sample_tokens(logits, cfgs, rngs);
    for (int64_t b = 0; b < 3; ++b) {
      const at::Tensor lp = at::log_softmax(logits[b] / temps[static_cast<size_t>(b)], 0);
      const auto& t = out[static_cast<size_t>(b)];
      EXPECT_NEAR(t.logprob, lp[t.id].item<float>(), 1e-5);
      ASSERT_EQ(static_cast<int64_t>(t.top.size()), cfgs[static_cast<size_t>(b)].top_logprobs);
      const auto ref = at::topk(lp, cfgs[static_cast<size_t>(b)].top_logprobs);
      for (size_t i = 0; i < t.top.size(); ++i) {
        if (i > 0) {
          EXPECT_GE(t.top[i - 1].second, t.top[i].second);
        }
        EXPECT_EQ(t.top[i].first, std::get<1>(ref)[static_cast<int64_t>(i)].item<int64_t>());
        EXPECT_NEAR(t.top[i].second, lp[t.top[i].first].item<float>(), 1e-5);
      }
    }
  }
  // top_logprobs = 0 reports nothing.
  SamplerRng r(5);
  EXPECT_TRUE(sample_one(logits.slice(0, 0, 1), temp(1.0), r).top.empty());
}

TEST(SamplerTest, MaskedTokensNeverSampled) {
  const float ninf = -std::numeric_limits<float>::infinity();
  // The masked ids would otherwise be the most likely ones.
  const std::vector<float> v = {ninf, 0.5f, 10.0f, 0.0f, ninf, 0.2f};
  std::vector<float> masked = v;
  masked[2] = ninf;
  const at::Tensor logits = row_logits(masked);
  SamplerRng rng(11);
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) {
    SamplingConfig cfg = temp(i % 2 ? 3.0 : 1.0);
    cfg.top_logprobs = 6;
    const auto t = sample_one(logits, cfg, rng);
    seen.insert(t.id);
    EXPECT_TRUE(std::isfinite(t.logprob));
    EXPECT_EQ(t.top.size(), 3u);  // only finite tokens are reported
  }
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3, 5}));
  EXPECT_EQ(sample_one(logits, temp(0.0), rng).id, 1);
  // Logits are not modified.
  EXPECT_TRUE(std::isinf(logits[0][0].item<float>()));
  EXPECT_FLOAT_EQ(logits[0][1].item<float>(), 0.5f);
}

TEST(SamplerTest, WorksOnInferenceTensorsAndRejectsBadInput) {
  at::Tensor logits;
  {
    c10::InferenceMode guard;
    logits = at::randn({2, 10});
  }
  std::vector<SamplingConfig> cfgs(2);
  SamplerRng r0(1), r1(2);
  std::vector<SamplerRng*> rngs{&r0, &r1};
  EXPECT_EQ(sample_tokens(logits, cfgs, rngs).size(), 2u);

  std::vector<SamplingConfig> one(1);
  EXPECT_THROW(sample_tokens(logits, one, rngs), SwarmError);
  std::vector<SamplerRng*> one_rng{&r0};
  std::vector<SamplingConfig> cfg1(1);
  const at::Tensor all_masked = at::full({1, 4}, -std::numeric_limits<float>::infinity());
  EXPECT_THROW(sample_tokens(all_masked, cfg1, one_rng), SwarmError);
  EXPECT_THROW(sample_tokens(at::zeros({4}), cfg1, one_rng), SwarmError);
}

TEST(SamplerTest, LargeVocabularyTopPIsReasonablyFast) {
  // 8 rows of a 150k vocabulary: exercises the incremental sort paths.
  const at::Tensor logits = at::randn({8, 150000}, at::TensorOptions().dtype(at::kFloat)) * 3.0;
  std::vector<SamplingConfig> cfgs(8);
  for (size_t b = 0; b < 8; ++b) {
    cfgs[b].temperature = 0.7;
    cfgs[b].top_p = b % 2 ? 0.95 : 1.0;
    cfgs[b].top_k = b % 4 == 3 ? 50 : -1;
    cfgs[b].top_logprobs = 5;
  }
  std::vector<SamplerRng> store;
  for (uint64_t b = 0; b < 8; ++b) store.emplace_back(b);
  std::vector<SamplerRng*> rngs;
  for (auto& r : store) rngs.push_back(&r);
  for (int step = 0; step < 3; ++step) {
    const auto out = sample_tokens(logits, cfgs, rngs);
    for (const auto& t : out) {
      EXPECT_GE(t.id, 0);
      EXPECT_LT(t.id, 150000);
      EXPECT_EQ(t.top.size(), 5u);
      EXPECT_LE(t.logprob, t.top[0].second);
    }
  }
}

}  // namespace
}  // namespace swarm
