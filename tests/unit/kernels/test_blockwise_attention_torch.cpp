// The blockwise (online-softmax) attention of training (kernels/cpu/blockwise_attention_torch.hpp)
// against the plain formula: the forward and lse against softmax(q·kᵀ·scale)·v computed in
// double here, in fp32 and bf16, for blocks smaller than, equal to and larger than the samples,
// with GQA and a sliding window; the gradients against python3-torch's autograd of the plain
// formula in float64 (tests/reference/attention_reference.py); sample boundaries inside a packed
// row kept exactly; bad shapes refused.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/error.hpp"
#include "kernels/cpu/blockwise_attention_torch.hpp"
#include "support/scratch_dir.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kHeads = 6, kKvHeads = 2, kHeadDim = 16;
const std::vector<int64_t> kCu = {0, 1, 8, 41, 91};  // samples of 1, 7, 33 and 50 tokens

struct Inputs {
  at::Tensor q, k, v;
};

Inputs random_inputs(at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  const int64_t n = kCu.back();
  return {at::randn({n, kHeads, kHeadDim}).to(dtype), at::randn({n, kKvHeads, kHeadDim}).to(dtype),
          at::randn({n, kKvHeads, kHeadDim}).to(dtype)};
}

double scale() { return 1.0 / std::sqrt(static_cast<double>(kHeadDim)); }

// The plain formula in double, one sample at a time: out [N, heads, hd] and lse [heads, N].
std::pair<at::Tensor, at::Tensor> plain(const Inputs& in, int64_t window) {
  const at::Tensor q = in.q.to(at::kDouble), k = in.k.to(at::kDouble), v = in.v.to(at::kDouble);
  const int64_t rep = kHeads / kKvHeads;
  std::vector<at::Tensor> outs, lses;
  for (size_t s = 0; s + 1 < kCu.size(); ++s) {
    const int64_t a = kCu[s], n = kCu[s + 1] - a;
    const at::Tensor qs = q.narrow(0, a, n).transpose(0, 1);
    const at::Tensor ks = k.narrow(0, a, n).transpose(0, 1).repeat_interleave(rep, 0);
    const at::Tensor vs = v.narrow(0, a, n).transpose(0, 1).repeat_interleave(rep, 0);
    at::Tensor scores = at::matmul(qs, ks.transpose(1, 2)) * scale();
    const at::Tensor i = at::arange(n).view({n, 1}), j = at::arange(n).view({1, n});
    at::Tensor blocked = j > i;
    if (window > 0) blocked = blocked.logical_or((i - j) >= window);
    scores = scores.masked_fill(blocked, -INFINITY);
    lses.push_back(at::logsumexp(scores, -1));
    outs.push_back(at::matmul(at::softmax(scores, -1), vs).transpose(0, 1));
  }
  return {at::cat(outs, 0), at::cat(lses, 1)};
}

double rel_max(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return ((g - w).abs().max() / w.abs().max()).item<double>();
}

double rel_norm(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  return ((g - w).norm() / w.norm()).item<double>();
}

// Blocks of 3 and 16 tokens split every sample but the first into several query and key blocks
// (a window of 5 then starts inside a block, and some rows of a block see no key of its first
// key block); 512 holds each sample in one block.
TEST(BlockwiseAttention, ForwardMatchesThePlainFormulaInFp32AndBf16) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const Inputs in = random_inputs(dtype, 7);
    for (int64_t window : {0, 5}) {
      const auto [want, want_lse] = plain(in, window);
      for (int64_t block : {3, 16, 512}) {
        const BlockwiseAttentionOutput got =
            blockwise_attention_forward(in.q, in.k, in.v, kCu, window, scale(), block);
        ASSERT_EQ(got.out.scalar_type(), dtype);
        // fp32: the sums' rounding (~1e-7 relative); bf16: the output's rounding to bf16 (2^-9
        // relative per element) on top of fp32 arithmetic over the same bf16 inputs.
        const double tol = dtype == at::kFloat ? 1e-5 : 8e-3;
        EXPECT_LE(rel_max(got.out, want), tol)
            << "dtype " << dtype << " window " << window << " block " << block;
        EXPECT_LE(rel_max(got.lse, want_lse), 1e-5) << "lse, window " << window << " block " << block;
      }
    }
  }
}

TEST(BlockwiseAttention, GradientsMatchPythonTorchAutogradOfThePlainFormula) {
  testing::ScratchDir scratch("swarm-attention");
  const fs::path script = fs::path(SWARM_SOURCE_DIR) / "tests" / "reference" / "attention_reference.py";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t window : {0, 5}) {
      const Inputs in = random_inputs(dtype, 11);
      at::manual_seed(12);
      const at::Tensor dout = at::randn({kCu.back(), kHeads, kHeadDim}).to(dtype);
      const auto to_json = [](const at::Tensor& t) {
        const at::Tensor c = t.to(at::kDouble).contiguous();
        json rows = json::array();
        for (int64_t i = 0; i < c.size(0); ++i) {
          json heads = json::array();
          for (int64_t h = 0; h < c.size(1); ++h) {
            const double* p = c[i][h].data_ptr<double>();
            heads.push_back(std::vector<double>(p, p + c.size(2)));
          }
          rows.push_back(std::move(heads));
        }
        return rows;
      };
      const json ref = testing::run_python_reference(script,
                                                     {{"q", to_json(in.q)},
                                                      {"k", to_json(in.k)},
                                                      {"v", to_json(in.v)},
                                                      {"dout", to_json(dout)},
                                                      {"cu_seqlens", kCu},
                                                      {"window", window},
                                                      {"scale", scale()}},
                                                     scratch.path());
      const auto from_json = [](const json& j, const at::Tensor& like) {
        at::Tensor t = at::empty(like.sizes(), at::kDouble);
        for (int64_t i = 0; i < t.size(0); ++i)
          for (int64_t h = 0; h < t.size(1); ++h)
            for (int64_t d = 0; d < t.size(2); ++d)
              t[i][h][d] =
                  j[static_cast<size_t>(i)][static_cast<size_t>(h)][static_cast<size_t>(d)].get<double>();
        return t;
      };
      const at::Tensor q = in.q.clone().requires_grad_(true), k = in.k.clone().requires_grad_(true),
                       v = in.v.clone().requires_grad_(true);
      const at::Tensor out = blockwise_attention(q, k, v, kCu, window, scale(), /*block=*/16);
      out.backward(dout);
      ASSERT_EQ(q.grad().scalar_type(), dtype);
      // fp32: rounding of sums over up to 50 keys; bf16: each gradient rounded to bf16, and the
      // saved output (bf16) entering D = rowsum(dO ∘ O).
      const double tol = dtype == at::kFloat ? 1e-5 : 1.5e-2;
      const std::string what =
          std::string("dtype ") + c10::toString(dtype) + " window " + std::to_string(window);
      EXPECT_LE(rel_norm(out, from_json(ref["out"], out)), tol) << what;
      EXPECT_LE(rel_norm(q.grad(), from_json(ref["dq"], q)), tol) << "dq " << what;
      EXPECT_LE(rel_norm(k.grad(), from_json(ref["dk"], k)), tol) << "dk " << what;
      EXPECT_LE(rel_norm(v.grad(), from_json(ref["dv"], v)), tol) << "dv " << what;
    }
  }
}

// Another sample's tokens change nothing of a sample's output or gradients, bit for bit.
TEST(BlockwiseAttention, NothingCrossesASampleBoundary) {
  const Inputs a = random_inputs(at::kFloat, 3);
  Inputs b{a.q.clone(), a.k.clone(), a.v.clone()};
  // Sample 2 (tokens 8..40) replaced.
  b.q.narrow(0, 8, 33).normal_();
  b.k.narrow(0, 8, 33).normal_();
  b.v.narrow(0, 8, 33).normal_();
  at::manual_seed(5);
  const at::Tensor dout = at::randn({kCu.back(), kHeads, kHeadDim});
  std::vector<std::vector<at::Tensor>> results;
  for (const Inputs* in : std::vector<const Inputs*>{&a, &b}) {
    const at::Tensor q = in->q.clone().requires_grad_(true), k = in->k.clone().requires_grad_(true),
                     v = in->v.clone().requires_grad_(true);
    const at::Tensor out = blockwise_attention(q, k, v, kCu, 0, scale(), 16);
    out.backward(dout);
    results.push_back({out.detach(), q.grad(), k.grad(), v.grad()});
  }
  for (size_t t = 0; t < 4; ++t) {
    for (const auto& [begin, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 8}, {41, 50}})
      EXPECT_TRUE(at::equal(results[0][t].narrow(0, begin, n), results[1][t].narrow(0, begin, n))) << t;
    EXPECT_FALSE(at::equal(results[0][t].narrow(0, 8, 33), results[1][t].narrow(0, 8, 33))) << t;
  }
}

TEST(BlockwiseAttention, RefusesInconsistentShapesAndBoundaries) {
  const Inputs in = random_inputs(at::kFloat, 1);
  const auto refused = [&](const std::vector<int64_t>& cu, const at::Tensor& k) {
    try {
      blockwise_attention_forward(in.q, k, in.v, cu, 0, scale());
    } catch (const SwarmError& e) {
      return e.kind() == ErrorKind::INVALID_ARGUMENT;
    }
    return false;
  };
  EXPECT_TRUE(refused({0, 8, 90}, in.k));                             // does not end at N
  EXPECT_TRUE(refused({0, 8, 8, 91}, in.k));                          // an empty sample
  EXPECT_TRUE(refused({8, 91}, in.k));                                // does not start at 0
  EXPECT_TRUE(refused(kCu, in.k.narrow(1, 0, 1).repeat({1, 4, 1})));  // 6 heads over 4 kv heads
  EXPECT_FALSE(refused(kCu, in.k));
}

}  // namespace
}  // namespace swarm
