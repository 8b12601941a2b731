// The hand-written CPU kernels against plain libtorch ops on random data: small_linear vs
// at::linear, paged_decode_attention vs softmax(q·Kᵀ)·V over the gathered context (with GQA,
// sliding window, scattered blocks), the fused serving ops vs the op chains they replace, in
// fp32 and bf16.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/cpu/cpu_dispatch.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/cpu/paged_attention_torch.hpp"
#include "kernels/cpu/serving_ops_torch.hpp"
#include "kernels/cpu/small_linear_torch.hpp"
#include "kernels/cpu/widening_linear_torch.hpp"

namespace swarm {
namespace {

double max_rel(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kFloat), w = want.to(at::kFloat);
  return ((g - w).abs().max() / w.abs().max().clamp_min(1e-6)).item<double>();
}

TEST(SmallLinear, MatchesLinearForEveryRowCountWithAndWithoutBias) {
  at::manual_seed(1);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    // Every count up to 8, then the tiles (4 rows with AVX512_BF16, 3 when widening) with each
    // remainder, up to the most this CPU's kernel takes for the dtype.
    std::vector<int64_t> counts;
    for (int64_t m = 1; m <= small_linear_max_rows(dtype); m += m < 12 ? 1 : m < 16 ? 3 : 21)
      counts.push_back(m);
    if (counts.back() != small_linear_max_rows(dtype)) counts.push_back(small_linear_max_rows(dtype));
    for (int64_t m : counts) {
      // Tails beyond the unrolled loop and the vector width; 1536: input rows past 24 KiB (the
      // tiles from 4 rows at the AVX2 level).
      for (int64_t in : {8, 40, 64, 100, 576, 1536}) {
        const at::Tensor x = at::randn({m, in}).to(dtype), w = at::randn({37, in}).to(dtype);
        const at::Tensor b = at::randn({37}).to(dtype);
        const at::Tensor want = at::linear(x.to(at::kFloat), w.to(at::kFloat), b.to(at::kFloat));
        const at::Tensor got = small_linear(x, w, b);
        EXPECT_EQ(got.scalar_type(), dtype);
        EXPECT_EQ(got.sizes(), (std::vector<int64_t>{m, 37}));
        EXPECT_LT(max_rel(got, want), dtype == at::kFloat ? 1e-5 : 1e-2) << "m=" << m << " in=" << in;
        EXPECT_LT(max_rel(small_linear(x, w, c10::nullopt), at::linear(x.to(at::kFloat), w.to(at::kFloat))),
                  dtype == at::kFloat ? 1e-5 : 1e-2);
      }
    }
  }
}

// float_out gives the very values of the default result, in fp32 (the logits skip a pass).
TEST(SmallLinear, FloatOutIsTheResultConvertedBitForBit) {
  at::manual_seed(7);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{9}, small_linear_max_rows(dtype)}) {
      if (m > small_linear_max_rows(dtype)) continue;
      for (int64_t out : {37, 64, 1000}) {  // with and without a tail beyond 16 lanes
        const at::Tensor x = at::randn({m, 100}).to(dtype), w = at::randn({out, 100}).to(dtype);
        const at::Tensor b = at::randn({out}).to(dtype);
        const at::Tensor got = small_linear(x, w, b, /*float_out=*/true);
        EXPECT_EQ(got.scalar_type(), at::kFloat);
        EXPECT_TRUE(at::equal(got, small_linear(x, w, b).to(at::kFloat)))
            << "m=" << m << " out=" << out << " " << dtype;
        EXPECT_TRUE(at::equal(small_linear(x, w, c10::nullopt, true),
                              small_linear(x, w, c10::nullopt).to(at::kFloat)));
      }
    }
  }
}

// The MLP's gate/up projection with its activation applied as the results leave the kernel is
// the projection followed by silu_mul, bit for bit: every row count's tiles, inter sizes with
// and without a tail beyond the 32-feature blocks and the 16 lanes, with and without bias.
TEST(SmallLinear, SiluMulIsTheProjectionThenSiluMulBitForBit) {
  at::manual_seed(8);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{9}, int64_t{16}, int64_t{37},
                      small_linear_max_rows(dtype)}) {
      if (m > small_linear_max_rows(dtype)) continue;
      for (int64_t inter : {8, 40, 48, 100}) {
        const at::Tensor x = at::randn({m, 72}).to(dtype);
        const at::Tensor w = (at::randn({2 * inter, 72}) * 0.5).to(dtype);
        const at::Tensor b = at::randn({2 * inter}).to(dtype);
        const at::Tensor got = small_linear_silu_mul(x, w, b);
        EXPECT_EQ(got.sizes(), (std::vector<int64_t>{m, inter}));
        EXPECT_EQ(got.scalar_type(), dtype);
        EXPECT_TRUE(at::equal(got, silu_mul(small_linear(x, w, b))))
            << "m=" << m << " inter=" << inter << " " << dtype;
        EXPECT_TRUE(
            at::equal(small_linear_silu_mul(x, w, c10::nullopt), silu_mul(small_linear(x, w, c10::nullopt))));
      }
    }
  }
  EXPECT_ANY_THROW(small_linear_silu_mul(at::randn({2, 8}), at::randn({5, 8}), c10::nullopt));  // odd rows
}

// The widening tiles (3 rows x 3 features, bf16 weights widened in registers): bf16 above 8
// rows without AVX512_BF16, and at the AVX2 level fp32 up to 32 rows and both dtypes at fewer
// rows (small_linear_torch.hpp). Each result is the fp32 product of the inputs (for bf16
// rounded once): elementwise within one bf16 rounding of the fp32 reference, or within fp32
// summation error, for every tail of the tiles (rows mod 3, features mod 3, in not a multiple
// of the 2W values a step takes).
TEST(SmallLinear, ManyRowsAreTheFp32ProductRoundedOnce) {
  at::manual_seed(12);
  bool ran = false;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const int64_t most = small_linear_max_rows(dtype);
    if (most <= kSmallLinearMaxRows) continue;
    ran = true;
    for (int64_t m : {int64_t{4}, int64_t{6}, int64_t{9}, int64_t{10}, int64_t{11}, int64_t{33}, most}) {
      if (m > most) continue;
      for (auto [in, out] :
           {std::pair<int64_t, int64_t>{576, 192}, {100, 37}, {40, 38}, {1536, 5}, {15, 4}}) {
        const at::Tensor x = at::randn({m, in}).to(dtype), w = at::randn({out, in}).to(dtype);
        const at::Tensor b = at::randn({out}).to(dtype);
        for (const at::Tensor& bias : {b, at::Tensor()}) {
          const at::Tensor want =
              at::linear(x.to(at::kDouble), w.to(at::kDouble), bias.defined() ? bias.to(at::kDouble) : bias)
                  .to(at::kFloat);
          const at::Tensor got =
              small_linear(x, w, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt);
          ASSERT_EQ(got.sizes(), (std::vector<int64_t>{m, out}));
          const at::Tensor err = (got.to(at::kFloat) - want).abs();
          const at::Tensor bound =
              dtype == at::kFloat ? want.abs() * 1e-5 + 1e-4 : want.abs() * (1.0 / 256) + 1e-3;
          EXPECT_TRUE((err <= bound).all().item<bool>())
              << dtype << " m=" << m << " in=" << in << " out=" << out << " max err "
              << err.max().item<float>();
        }
      }
    }
  }
  if (!ran) GTEST_SKIP() << "no more than 8 rows in either dtype at " << cpu_level_name(cpu_level());
}

TEST(SmallLinear, TakesWhatTheCpuLevelAllows) {
  EXPECT_EQ(small_linear_max_rows(at::kFloat), SWARM_HAVE_X86_KERNELS && cpu_level() == CpuLevel::AVX2
                                                   ? kSmallLinearTileMaxRows
                                                   : kSmallLinearMaxRows)
      << cpu_level_name(cpu_level());
  const int64_t bf16 = small_linear_max_rows(at::kBFloat16);
  const int64_t want = cpu_has_avx512_bf16()                                     ? kSmallLinearBf16MaxRows
                       : SWARM_HAVE_X86_KERNELS && cpu_level() >= CpuLevel::AVX2 ? kSmallLinearWideningMaxRows
                                                                                 : kSmallLinearMaxRows;
  EXPECT_EQ(bf16, want) << cpu_level_name(cpu_level());
  const at::Tensor w = at::randn({4, 8}).to(at::kBFloat16);
  EXPECT_NO_THROW(small_linear(at::randn({bf16, 8}).to(at::kBFloat16), w, c10::nullopt));
  EXPECT_ANY_THROW(small_linear(at::randn({std::max(bf16, kSmallLinearMaxRows) + 1, 8}).to(at::kBFloat16), w,
                                c10::nullopt));
}

TEST(SmallLinear, RejectsWhatItIsNotFor) {
  EXPECT_ANY_THROW(
      small_linear(at::randn({small_linear_max_rows(at::kFloat) + 1, 8}), at::randn({4, 8}), c10::nullopt));
  EXPECT_ANY_THROW(small_linear(at::randn({1, 8}), at::randn({4, 9}), c10::nullopt));
  EXPECT_ANY_THROW(
      small_linear(at::randn({1, 8}).to(at::kDouble), at::randn({4, 8}).to(at::kDouble), c10::nullopt));
}

// Reference: gather each sequence's keys, plain softmax attention in fp32.
at::Tensor reference_attention(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& vc,
                               const PagedContext& ctx, int64_t window, double scale) {
  const int64_t B = q.size(0), H = q.size(1), hd = q.size(2), kvh = kc.size(2), bs = kc.size(1);
  std::vector<at::Tensor> outs;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = ctx.lengths[static_cast<size_t>(b)];
    std::vector<int64_t> rows;
    for (int64_t j = std::max<int64_t>(0, len - window); j < len; ++j)
      rows.push_back(ctx.block_ids[static_cast<size_t>(ctx.table_offset[static_cast<size_t>(b)] + j / bs)] *
                         bs +
                     j % bs);
    const at::Tensor idx = at::tensor(rows, at::kLong);
    const at::Tensor k = kc.view({-1, kvh, hd}).index_select(0, idx).to(at::kFloat);  // [n, kvh, hd]
    const at::Tensor v = vc.view({-1, kvh, hd}).index_select(0, idx).to(at::kFloat);
    std::vector<at::Tensor> heads;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / kvh);
      const at::Tensor s = at::matmul(k.select(1, g), q[b][h].to(at::kFloat)) * scale;  // [n]
      heads.push_back(at::matmul(at::softmax(s, 0), v.select(1, g)));                   // [hd]
    }
    outs.push_back(at::cat(heads, 0));
  }
  return at::stack(outs, 0);
}

// head_dim 8 .. 128 covers every vector-width case of the kernel on AVX-512 (W 16) and on
// AVX2 / baseline (W 8), and 24 / 40 the plain loop; lengths 1, 9, 23 and 70 cover padding
// keys, several blocks and, with window 5, a window inside the context.
TEST(PagedDecodeAttention, MatchesGatheredSoftmaxAttention) {
  at::manual_seed(2);
  std::mt19937 rng(3);
  const int64_t bs = 4, blocks = 60;
  struct Shape {
    int64_t heads, kvh, hd;
  };
  for (const Shape& shape : {Shape{8, 2, 32}, Shape{9, 3, 64}, Shape{4, 4, 8}, Shape{2, 1, 16},
                             Shape{6, 2, 48}, Shape{4, 2, 128}, Shape{3, 1, 24}, Shape{2, 2, 40}}) {
    const int64_t heads = shape.heads, kvh = shape.kvh, hd = shape.hd;
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t window : {int64_t{1} << 40, int64_t{5}}) {
        const at::Tensor kc = at::randn({blocks, bs, kvh, hd}).to(dtype);
        const at::Tensor vc = at::randn({blocks, bs, kvh, hd}).to(dtype);
        // Four sequences with scattered, disjoint blocks.
        std::vector<int64_t> free(blocks);
        std::iota(free.begin(), free.end(), 0);
        std::shuffle(free.begin(), free.end(), rng);
        PagedContext ctx;
        ctx.table_offset.push_back(0);
        for (int64_t len : {1, 9, 23, 70}) {
          const int64_t n = (len + bs - 1) / bs;
          for (int64_t i = 0; i < n; ++i) {
            ctx.block_ids.push_back(free.back());
            free.pop_back();
          }
          ctx.table_offset.push_back(static_cast<int64_t>(ctx.block_ids.size()));
          ctx.lengths.push_back(len);
        }
        // Scores of a few units, so the softmax is far from uniform.
        const at::Tensor q = (at::randn({4, heads, hd}) * 3).to(dtype);
        const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
        const at::Tensor got = paged_decode_attention(q, kc, vc, ctx, window, scale);
        const at::Tensor want = reference_attention(q, kc, vc, ctx, window, scale).to(dtype);
        EXPECT_EQ(got.sizes(), (std::vector<int64_t>{4, heads * hd}));
        EXPECT_LT(max_rel(got, want), dtype == at::kFloat ? 1e-5 : 2e-2)
            << "head_dim " << hd << " window " << window << " dtype " << dtype;
      }
    }
  }
}

// Every kernel takes the caller's buffer as `out` (the serving step keeps its activations from
// one step to the next): the result is written there, bit for bit what a new tensor would hold,
// and a buffer of the wrong shape, dtype or layout, or one overlapping an input, is refused.
TEST(Kernels, WriteIntoTheCallersBufferBitForBit) {
  at::manual_seed(8);
  const auto into = [](const char* what, const at::Tensor& fresh,
                       const std::function<at::Tensor(const at::Tensor&)>& f) {
    at::Tensor buffer = at::full(fresh.sizes(), 7.0, fresh.options());
    const at::Tensor got = f(buffer);
    EXPECT_EQ(got.data_ptr(), buffer.data_ptr()) << what << ": the result is the buffer";
    EXPECT_TRUE(at::equal(buffer, fresh)) << what;
    EXPECT_ANY_THROW(f(at::empty({fresh.numel() + 1}, fresh.options()))) << what << ": wrong shape";
    const at::ScalarType other = fresh.scalar_type() == at::kFloat ? at::kBFloat16 : at::kFloat;
    EXPECT_ANY_THROW(f(at::empty(fresh.sizes(), fresh.options().dtype(other)))) << what << ": wrong dtype";
    if (fresh.dim() == 2 && fresh.size(0) > 1 && fresh.size(1) > 1) {
      EXPECT_ANY_THROW(f(at::empty({fresh.size(1), fresh.size(0)}, fresh.options()).t()))
          << what << ": not contiguous";
    }
  };
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const int64_t m = 3, in = 64, out = 40, h = 64;
    const at::Tensor x = at::randn({m, in}).to(dtype), w = at::randn({out, in}).to(dtype),
                     b = at::randn({out}).to(dtype);
    into("small_linear", small_linear(x, w, b),
         [&](const at::Tensor& o) { return small_linear(x, w, b, false, o); });
    into("small_linear float_out", small_linear(x, w, b, true),
         [&](const at::Tensor& o) { return small_linear(x, w, b, true, o); });
    into("small_linear_silu_mul", small_linear_silu_mul(x, w, b),
         [&](const at::Tensor& o) { return small_linear_silu_mul(x, w, b, o); });
    const at::Tensor gate_up = at::randn({m, 2 * out}).to(dtype);
    into("silu_mul", silu_mul(gate_up), [&](const at::Tensor& o) { return silu_mul(gate_up, o); });
    const at::Tensor xs = at::randn({m, h}).to(dtype), nw = at::randn({h}).to(dtype),
                     d = at::randn({m, h}).to(dtype);
    into("rms_norm_rows", rms_norm_rows(xs, nw, 1e-5),
         [&](const at::Tensor& o) { return rms_norm_rows(xs, nw, 1e-5, o); });
    at::Tensor x_fresh = xs.clone();
    const at::Tensor normed = add_rms_norm_rows(x_fresh, d, nw, 1e-5);
    into("add_rms_norm_rows", normed, [&](const at::Tensor& o) {
      at::Tensor x_again = xs.clone();
      return add_rms_norm_rows(x_again, d, nw, 1e-5, o);
    });
    const int64_t heads = 4, kvh = 2, hd = 16, rows = 8;
    const at::Tensor qkv = at::randn({m, (heads + 2 * kvh) * hd}).to(dtype);
    const at::Tensor angles = at::rand({10, hd}) * 6;
    const at::Tensor cos = angles.cos().to(dtype), sin = angles.sin().to(dtype);
    const at::Tensor pos = at::tensor(std::vector<int64_t>{1, 5, 9}, at::kLong);
    const at::Tensor cache_rows = at::tensor(std::vector<int64_t>{0, 3, 7}, at::kLong);
    at::Tensor kc = at::zeros({rows, kvh, hd}).to(dtype), vc = at::zeros({rows, kvh, hd}).to(dtype);
    into("rope_qkv_into_cache", rope_qkv_into_cache(qkv, heads, kvh, hd, cos, sin, pos, cache_rows, kc, vc),
         [&](const at::Tensor& o) {
           return rope_qkv_into_cache(qkv, heads, kvh, hd, cos, sin, pos, cache_rows, kc, vc, o);
         });
    const at::Tensor kb = at::randn({4, 4, kvh, hd}).to(dtype), vb = at::randn({4, 4, kvh, hd}).to(dtype);
    PagedContext ctx;
    ctx.block_ids = {2, 0, 3, 1};
    ctx.table_offset = {0, 2, 3, 4};
    ctx.lengths = {7, 4, 1};
    const at::Tensor q = at::randn({m, heads, hd}).to(dtype);
    into("paged_decode_attention", paged_decode_attention(q, kb, vb, ctx, 1 << 20, 0.25),
         [&](const at::Tensor& o) { return paged_decode_attention(q, kb, vb, ctx, 1 << 20, 0.25, o); });

    // A buffer that is (part of) an input is refused, not half-overwritten mid-read.
    EXPECT_ANY_THROW(small_linear(xs, at::randn({h, h}).to(dtype), c10::nullopt, false, xs));
    EXPECT_ANY_THROW(rms_norm_rows(xs, nw, 1e-5, xs));
    at::Tensor x_same = xs.clone();
    EXPECT_ANY_THROW(add_rms_norm_rows(x_same, d, nw, 1e-5, d));
    EXPECT_ANY_THROW(silu_mul(gate_up, gate_up.view({-1}).narrow(0, 0, m * out).view({m, out})));
  }
}

// The kernels split big work over threads (output features; sequence x kv head) and keep
// small work on the calling thread. The split must not change a single bit: each output is
// computed by one thread in the same order either way.
TEST(Kernels, SplittingOverTwoThreadsChangesNoBit) {
  at::manual_seed(4);
  std::mt19937 rng(5);
  const int before = at::get_num_threads();
  const auto run_both = [&](const std::function<at::Tensor()>& f) {
    at::set_num_threads(1);
    set_small_linear_threads(1);
    const at::Tensor one = f();
    at::set_num_threads(2);
    set_small_linear_threads(2);
    const at::Tensor two = f();
    return std::make_pair(one, two);
  };
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    // 1000 outputs x 576 inputs: big enough to be split at every row count.
    const at::Tensor w = at::randn({1000, 576}).to(dtype), b = at::randn({1000}).to(dtype);
    for (int64_t m : {int64_t{1}, int64_t{3}, small_linear_max_rows(dtype)}) {
      const at::Tensor x = at::randn({m, 576}).to(dtype);
      const auto [one, two] = run_both([&] { return small_linear(x, w, b); });
      EXPECT_TRUE(at::equal(one, two)) << "small_linear m=" << m << " dtype " << dtype;
    }
    // 12 sequences of 150 keys, 8 heads over 2 kv heads of 64: split over (sequence, kv head).
    const int64_t bs = 16, blocks = 12 * 10, heads = 8, kvh = 2, hd = 64;
    const at::Tensor kc = at::randn({blocks, bs, kvh, hd}).to(dtype),
                     vc = at::randn({blocks, bs, kvh, hd}).to(dtype);
    std::vector<int64_t> order(blocks);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    PagedContext ctx;
    ctx.block_ids = order;
    for (int64_t s = 0; s <= 12; ++s) ctx.table_offset.push_back(s * 10);
    for (int64_t s = 0; s < 12; ++s) ctx.lengths.push_back(150 - s);
    const at::Tensor q = (at::randn({12, heads, hd}) * 3).to(dtype);
    const auto [one, two] = run_both([&] { return paged_decode_attention(q, kc, vc, ctx, 1 << 20, 0.125); });
    EXPECT_TRUE(at::equal(one, two)) << "paged_decode_attention dtype " << dtype;
  }
  at::set_num_threads(before);
  set_small_linear_threads(0);
}

// A query with more than 1024 visible keys has them split into parts computed apart and
// merged (every thread busy at batch 1). Against the reference at lengths just over the limit,
// at the limit, well over it, and with a window that splits; on every vector-width path and the
// plain loop (head_dim 24). The parts depend on the key count only: a sequence alone gives the
// same bits as in a batch, and one thread the same bits as two.
TEST(PagedDecodeAttention, LongContextsSplitIntoPartsAndMerge) {
  at::manual_seed(12);
  std::mt19937 rng(13);
  const int64_t bs = 16;
  struct Shape {
    int64_t heads, kvh, hd;
  };
  const int before = at::get_num_threads();
  // Every output path of the vector kernel: 2-4 heads a kv head (value pairs), 8 (head groups
  // with parked sums), 1 (one head); and head_dim 24, the plain loop.
  for (const Shape& shape : {Shape{9, 3, 64}, Shape{8, 2, 32}, Shape{4, 2, 128}, Shape{2, 1, 16},
                             Shape{8, 1, 64}, Shape{4, 4, 32}, Shape{3, 1, 24}}) {
    const int64_t heads = shape.heads, kvh = shape.kvh, hd = shape.hd;
    const std::vector<int64_t> lengths = {1025, 1024, 3000, 70, 2100};
    int64_t blocks = 0;
    for (int64_t len : lengths) blocks += (len + bs - 1) / bs;
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor kc = at::randn({blocks, bs, kvh, hd}).to(dtype),
                       vc = at::randn({blocks, bs, kvh, hd}).to(dtype);
      std::vector<int64_t> free(static_cast<size_t>(blocks));
      std::iota(free.begin(), free.end(), 0);
      std::shuffle(free.begin(), free.end(), rng);
      PagedContext ctx;
      ctx.table_offset.push_back(0);
      for (int64_t len : lengths) {
        for (int64_t i = 0; i < (len + bs - 1) / bs; ++i) {
          ctx.block_ids.push_back(free.back());
          free.pop_back();
        }
        ctx.table_offset.push_back(static_cast<int64_t>(ctx.block_ids.size()));
        ctx.lengths.push_back(len);
      }
      const auto B = static_cast<int64_t>(lengths.size());
      const at::Tensor q = (at::randn({B, heads, hd}) * 3).to(dtype);
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      for (int64_t window : {int64_t{1} << 40, int64_t{2000}}) {
        const std::string what = "heads " + std::to_string(heads) + "/" + std::to_string(kvh) + " head_dim " +
                                 std::to_string(hd) + " window " + std::to_string(window) + " " +
                                 std::string(c10::toString(dtype));
        at::set_num_threads(2);
        const at::Tensor got = paged_decode_attention(q, kc, vc, ctx, window, scale);
        EXPECT_LT(max_rel(got, reference_attention(q, kc, vc, ctx, window, scale).to(dtype)),
                  dtype == at::kFloat ? 1e-5 : 2e-2)
            << what;
        at::set_num_threads(1);
        EXPECT_TRUE(at::equal(got, paged_decode_attention(q, kc, vc, ctx, window, scale)))
            << "one thread: " << what;
        at::set_num_threads(2);
        for (int64_t b = 0; b < B; ++b) {  // each sequence alone
          PagedContext one;
          const auto t0 = ctx.table_offset[static_cast<size_t>(b)],
                     t1 = ctx.table_offset[static_cast<size_t>(b) + 1];
          one.block_ids.assign(ctx.block_ids.begin() + t0, ctx.block_ids.begin() + t1);
          one.table_offset = {0, t1 - t0};
          one.lengths = {ctx.lengths[static_cast<size_t>(b)]};
          const at::Tensor alone =
              paged_decode_attention(q.narrow(0, b, 1).contiguous(), kc, vc, one, window, scale);
          EXPECT_TRUE(at::equal(alone, got.narrow(0, b, 1))) << "sequence " << b << " alone: " << what;
        }
      }
    }
  }
  at::set_num_threads(before);
}

TEST(PagedDecodeAttention, OneDominantKeyTakesAllTheWeight) {
  // One key scoring far above the rest takes all the weight (no overflow in the exponentials).
  const int64_t hd = 64;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor kc = at::zeros({2, 4, 1, hd}), vc = at::zeros({2, 4, 1, hd});
    kc[0][1][0].fill_(1.0);
    vc[0][1][0].fill_(7.0);
    vc[0][0][0].fill_(-3.0);
    const at::Tensor q = at::full({1, 1, hd}, 100.0).to(dtype);
    PagedContext ctx{{0}, {0, 1}, {3}, {}};
    const at::Tensor got = paged_decode_attention(q, kc.to(dtype), vc.to(dtype), ctx, 1 << 20, 1.0);
    EXPECT_LT(max_rel(got, at::full({1, hd}, 7.0)), 1e-6) << dtype;
  }
}

// The tokens of a prompt chunk are queries that share their sequence's block table, each
// reading up to its own position: exactly what one table per query gives, and the reference.
TEST(PagedDecodeAttention, QueriesCanShareABlockTable) {
  at::manual_seed(9);
  const int64_t bs = 4, heads = 6, kvh = 2;
  for (int64_t hd : {16, 64}) {
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor kc = at::randn({12, bs, kvh, hd}).to(dtype),
                       vc = at::randn({12, bs, kvh, hd}).to(dtype);
      const std::vector<std::vector<int64_t>> tables = {{7, 2, 9}, {4, 11}};
      // Sequence 0: a chunk at positions 5..9; sequence 1: one decoding token at position 6.
      const std::vector<int64_t> table_of = {0, 0, 0, 0, 0, 1}, lengths = {6, 7, 8, 9, 10, 7};
      PagedContext shared;
      shared.table_offset = {0};
      for (const auto& t : tables) {
        shared.block_ids.insert(shared.block_ids.end(), t.begin(), t.end());
        shared.table_offset.push_back(static_cast<int64_t>(shared.block_ids.size()));
      }
      shared.lengths = lengths;
      shared.table_index = table_of;
      PagedContext apart;  // the same, one copy of the table per query
      apart.table_offset = {0};
      for (int64_t t : table_of) {
        const auto& table = tables[static_cast<size_t>(t)];
        apart.block_ids.insert(apart.block_ids.end(), table.begin(), table.end());
        apart.table_offset.push_back(static_cast<int64_t>(apart.block_ids.size()));
      }
      apart.lengths = lengths;
      const at::Tensor q = (at::randn({6, heads, hd}) * 2).to(dtype);
      const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
      for (int64_t window : {int64_t{1} << 40, int64_t{3}}) {
        const at::Tensor got = paged_decode_attention(q, kc, vc, shared, window, scale);
        EXPECT_TRUE(at::equal(got, paged_decode_attention(q, kc, vc, apart, window, scale)))
            << "hd " << hd << " " << dtype;
        EXPECT_LT(max_rel(got, reference_attention(q, kc, vc, apart, window, scale).to(dtype)),
                  dtype == at::kFloat ? 1e-5 : 2e-2);
      }
      PagedContext bad = shared;
      bad.table_index[2] = 2;  // no table 2
      EXPECT_ANY_THROW(paged_decode_attention(q, kc, vc, bad, 1 << 20, scale));
      bad = shared;
      bad.table_index.pop_back();  // a query without a table
      EXPECT_ANY_THROW(paged_decode_attention(q, kc, vc, bad, 1 << 20, scale));
      bad = shared;
      bad.lengths[5] = 9;  // beyond table 1's two blocks of 4
      EXPECT_ANY_THROW(paged_decode_attention(q, kc, vc, bad, 1 << 20, scale));
    }
  }
}

TEST(PagedDecodeAttention, RejectsALengthBeyondItsBlocks) {
  const at::Tensor kc = at::zeros({4, 4, 1, 8}), q = at::zeros({1, 1, 8});
  PagedContext ctx{{0}, {0, 1}, {5}, {}};  // 5 keys in one block of 4
  EXPECT_ANY_THROW(paged_decode_attention(q, kc, kc, ctx, 1 << 20, 1.0));
}

// ---------------------------------------------------------------- fused serving ops

// The op chains DecoderModel runs without the fused kernels.
at::Tensor reference_rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const at::Tensor xf = x.to(at::kFloat);
  return (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(x.scalar_type()) * w;
}
at::Tensor reference_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

TEST(ServingOps, RmsNormMatchesTheOpChain) {
  at::manual_seed(3);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t h : {8, 20, 64, 576}) {  // below, at and beyond the vector width, with tails
      for (int64_t n : {1, 3, 40}) {
        const at::Tensor x = (at::randn({n, h}) * 3).to(dtype), w = at::randn({h}).to(dtype);
        const at::Tensor got = rms_norm_rows(x, w, 1e-5);
        EXPECT_EQ(got.scalar_type(), dtype);
        // The sum of squares is added in another order: a last-bit difference in fp32 can move
        // a bf16 rounding by one unit.
        EXPECT_LT(max_rel(got, reference_rms_norm(x, w, 1e-5)), dtype == at::kFloat ? 1e-6 : 1e-2)
            << "h=" << h << " n=" << n;
      }
    }
  }
  EXPECT_ANY_THROW(rms_norm_rows(at::randn({2, 8}), at::randn({9}), 1e-5));
  EXPECT_ANY_THROW(rms_norm_rows(at::randn({2, 8}).to(at::kDouble), at::randn({8}).to(at::kDouble), 1e-5));
}

// The fused residual add + RMSNorm is the two separate steps, bit for bit: x.add_(delta)
// (rounded to the dtype) and rms_norm_rows of the result.
TEST(ServingOps, AddRmsNormIsTheAddThenTheNormBitForBit) {
  at::manual_seed(6);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t h : {8, 20, 64, 576}) {
      for (int64_t n : {1, 3, 40}) {
        const at::Tensor x0 = (at::randn({n, h}) * 3).to(dtype), d = at::randn({n, h}).to(dtype);
        const at::Tensor w = at::randn({h}).to(dtype);
        at::Tensor fused_x = x0.clone();
        const at::Tensor got = add_rms_norm_rows(fused_x, d, w, 1e-5);
        at::Tensor want_x = x0.clone();
        want_x.add_(d);
        EXPECT_TRUE(at::equal(fused_x, want_x)) << "x, h=" << h << " n=" << n << " " << dtype;
        EXPECT_TRUE(at::equal(got, rms_norm_rows(want_x, w, 1e-5)))
            << "y, h=" << h << " n=" << n << " " << dtype;
      }
    }
  }
  at::Tensor x = at::randn({2, 8});
  EXPECT_ANY_THROW(add_rms_norm_rows(x, at::randn({2, 9}), at::randn({8}), 1e-5));
  EXPECT_ANY_THROW(add_rms_norm_rows(x, at::randn({2, 8}).to(at::kBFloat16), at::randn({8}), 1e-5));
}

TEST(ServingOps, RopeIntoCacheMatchesTheOpChainBitForBit) {
  at::manual_seed(4);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t hd :
         {8, 16, 20, 48, 64}) {  // half 4 and 10 take the scalar tails; 8 and 24 half-width vectors
      const int64_t heads = 6, kvh = 2, n = 5, rows = 12, positions = 40;
      at::Tensor qkv = at::randn({n, (heads + 2 * kvh) * hd}).to(dtype);
      if (dtype ==
          at::kBFloat16) {  // products rounded without a NaN case: NaN and inf still end as the op chain's
        qkv[0][0] = std::numeric_limits<float>::quiet_NaN();
        qkv[1][hd / 2] = std::numeric_limits<float>::infinity();
        qkv[2][heads * hd + 1] = -std::numeric_limits<float>::infinity();
        qkv[3][hd + hd / 2 + 1] = 3.0e38;
      }
      const at::Tensor angles = at::rand({positions, hd}) * 6;
      const at::Tensor cos = angles.cos().to(dtype), sin = angles.sin().to(dtype);
      const at::Tensor pos = at::tensor(std::vector<int64_t>{7, 0, 39, 8, 8}, at::kLong);
      const at::Tensor cache_rows = at::tensor(std::vector<int64_t>{3, 11, 0, 5, 6}, at::kLong);
      at::Tensor kc = at::full({rows, kvh, hd}, -9.0).to(dtype),
                 vc = at::full({rows, kvh, hd}, -9.0).to(dtype);
      const at::Tensor q = rope_qkv_into_cache(qkv, heads, kvh, hd, cos, sin, pos, cache_rows, kc, vc);

      const at::Tensor c = cos.index_select(0, pos).view({n, 1, hd}),
                       s = sin.index_select(0, pos).view({n, 1, hd});
      const at::Tensor want_q = reference_rope(qkv.narrow(1, 0, heads * hd).view({n, heads, hd}), c, s);
      const at::Tensor want_k = reference_rope(qkv.narrow(1, heads * hd, kvh * hd).view({n, kvh, hd}), c, s);
      const at::Tensor want_v = qkv.narrow(1, (heads + kvh) * hd, kvh * hd).view({n, kvh, hd});
      // Bit for bit, NaN where the op chain has NaN (whose own pattern is 0xffff from libtorch's
      // vectorised conversion, 0x7fc0 from c10::BFloat16's and ours).
      auto same = [](const at::Tensor& got, const at::Tensor& want) {
        const at::Tensor nan = want.isnan();
        const auto as_bits = [&](const at::Tensor& t) {
          return t.masked_fill(nan, 0).contiguous().view(t.scalar_type() == at::kFloat ? at::kInt
                                                                                       : at::kShort);
        };
        return at::equal(got.isnan(), nan) && at::equal(as_bits(got), as_bits(want));
      };
      EXPECT_TRUE(same(q, want_q)) << "hd=" << hd << " " << dtype;
      EXPECT_TRUE(same(kc.index_select(0, cache_rows), want_k)) << "hd=" << hd << " " << dtype;
      EXPECT_TRUE(same(vc.index_select(0, cache_rows), want_v)) << "hd=" << hd << " " << dtype;
      // Every other cache row untouched.
      const at::Tensor others = at::tensor(std::vector<int64_t>{1, 2, 4, 7, 8, 9, 10}, at::kLong);
      EXPECT_TRUE(at::equal(kc.index_select(0, others), at::full({7, kvh, hd}, -9.0).to(dtype)));
      EXPECT_TRUE(at::equal(vc.index_select(0, others), at::full({7, kvh, hd}, -9.0).to(dtype)));
    }
  }
}

TEST(ServingOps, RopeRejectsRowsOutOfRange) {
  const int64_t hd = 8;
  const at::Tensor qkv = at::randn({1, 4 * hd}), tab = at::randn({4, hd});
  at::Tensor kc = at::zeros({2, 1, hd}), vc = at::zeros({2, 1, hd});
  const at::Tensor ok = at::tensor(std::vector<int64_t>{1}, at::kLong),
                   bad = at::tensor(std::vector<int64_t>{2}, at::kLong);
  EXPECT_NO_THROW(rope_qkv_into_cache(qkv, 2, 1, hd, tab, tab, ok, ok, kc, vc));
  EXPECT_ANY_THROW(rope_qkv_into_cache(qkv, 2, 1, hd, tab, tab, ok, bad, kc, vc));  // cache row 2 of 2
  EXPECT_ANY_THROW(rope_qkv_into_cache(qkv, 2, 1, hd, tab, tab,
                                       at::tensor(std::vector<int64_t>{4}, at::kLong), ok, kc,
                                       vc));  // position 4 of 4
}

TEST(ServingOps, SiluMulMatchesTheOpChain) {
  at::manual_seed(5);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t inter : {7, 16, 100, 1536}) {
      for (int64_t n : {1, 9}) {
        at::Tensor gate_up = (at::randn({n, 2 * inter}) * 4).to(dtype);
        gate_up[0][0] = -90.0;  // e^-90 underflows: silu -> -0
        gate_up[0][1] = 90.0;
        const at::Tensor want = at::silu(gate_up.narrow(1, 0, inter)) * gate_up.narrow(1, inter, inter);
        const at::Tensor got = silu_mul(gate_up);
        EXPECT_EQ(got.sizes(), want.sizes());
        // Our exponential is within a few ulp of libtorch's: rarely one bf16 unit apart.
        EXPECT_LT(max_rel(got, want), dtype == at::kFloat ? 1e-5 : 1e-2) << "inter=" << inter << " " << dtype;
      }
    }
  }
}

TEST(ServingOps, SoftmaxRowStatsAndRowsMatchLogSoftmax) {
  at::manual_seed(6);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int64_t v : {5, 100, 49152}) {  // scalar only, vector + tail, a real vocabulary
    at::Tensor x = at::randn({3, v}) * 4;
    x[1][v / 2] = 30.0;  // one dominant logit
    x[2][0] = -kInf;     // masked logits
    x[2][v - 1] = -kInf;
    const std::vector<float> temps{1.0f, 0.7f, 1.3f};
    const std::vector<SoftmaxRowStats> stats = softmax_row_stats(x, temps);
    ASSERT_EQ(stats.size(), 3u);
    for (int64_t b = 0; b < 3; ++b) {
      const float t = temps[static_cast<size_t>(b)];
      const at::Tensor want = at::log_softmax(x[b] / t, 0);
      EXPECT_EQ(stats[static_cast<size_t>(b)].argmax, at::argmax(x[b]).item<int64_t>())
          << "v=" << v << " b=" << b;
      EXPECT_FALSE(stats[static_cast<size_t>(b)].has_nan);
      std::vector<float> logp(static_cast<size_t>(v)), probs(static_cast<size_t>(v));
      log_softmax_row(x[b].contiguous().data_ptr<float>(), v, t, stats[static_cast<size_t>(b)], logp.data(),
                      probs.data());
      const at::Tensor got = at::from_blob(logp.data(), {v}, at::kFloat);
      const at::Tensor finite = want.isfinite();
      EXPECT_TRUE(at::equal(got.isfinite(), finite)) << "masked logits stay -inf";
      EXPECT_LT((got.masked_select(finite) - want.masked_select(finite)).abs().max().item<float>(), 1e-5)
          << "v=" << v;
      const at::Tensor p = at::from_blob(probs.data(), {v}, at::kFloat);
      EXPECT_LT((p - want.exp()).abs().max().item<float>(), 1e-5) << "v=" << v;  // float sums over the row
      EXPECT_EQ(p.masked_select(finite.logical_not()).sum().item<float>(), 0.f)
          << "masked logits: probability 0";
    }
  }
  // Ties: the first index of the maximum, wherever the copies fall (same lane, other lanes, other
  // chains, the vectors after the chains, the tail), as torch.argmax gives it, at any
  // temperature; a row of -inf and a row whose maximum is only in the tail.
  for (int64_t v : {7, 37, 200, 1000}) {
    std::mt19937 rng(static_cast<unsigned>(v));
    for (int trial = 0; trial < 50; ++trial) {
      at::Tensor x = at::randint(0, 3, {1, v}).to(at::kFloat);  // many equal values
      if (trial % 7 == 0) x.fill_(-kInf), x[0][static_cast<int64_t>(rng() % v)] = 2.0;
      if (trial == 1) x.fill_(-kInf);
      const SoftmaxRowStats st = softmax_row_stats(x, {trial % 2 ? 0.7f : 1.0f})[0];
      EXPECT_EQ(st.argmax, trial == 1 ? 0 : at::argmax(x[0]).item<int64_t>())
          << "v=" << v << " trial " << trial;
    }
  }
  at::Tensor bad = at::zeros({2, 40});
  bad[0][7] = std::numeric_limits<float>::quiet_NaN();
  bad[1].fill_(-kInf);
  const std::vector<SoftmaxRowStats> stats = softmax_row_stats(bad, {1.0f, 1.0f});
  EXPECT_TRUE(stats[0].has_nan);
  EXPECT_EQ(stats[1].max, -kInf);
  EXPECT_ANY_THROW(softmax_row_stats(bad, {1.0f}));
  EXPECT_ANY_THROW(softmax_row_stats(bad, {1.0f, 0.0f}));
  EXPECT_ANY_THROW(softmax_row_stats(bad, {1.0f, std::numeric_limits<float>::infinity()}));
  for (int64_t at_j : {0, 45, 130, 199}) {  // a NaN in each part of the first pass
    at::Tensor row = at::randn({1, 200});
    row[0][at_j] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(softmax_row_stats(row, {0.7f})[0].has_nan) << at_j;
  }
  // The row is searched for a NaN only when its sum comes out NaN or its maximum is -inf: a NaN
  // among -inf, a NaN beside +inf, +inf alone (a NaN sum without a NaN), a row of NaN.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor odd = at::full({4, 70}, -kInf);
  odd[0][33] = nan;
  odd[1] = at::randn({70});
  odd[1][5] = kInf;
  odd[1][60] = nan;
  odd[2] = at::randn({70});
  odd[2][5] = kInf;
  odd[3].fill_(nan);
  for (float t : {1.0f, 0.7f}) {
    const std::vector<SoftmaxRowStats> st = softmax_row_stats(odd, {t, t, t, t});
    EXPECT_TRUE(st[0].has_nan);
    EXPECT_EQ(st[0].max, -kInf);
    EXPECT_TRUE(st[1].has_nan);
    EXPECT_EQ(st[1].log_sum, 0.f);
    EXPECT_FALSE(st[2].has_nan);
    EXPECT_EQ(st[2].max, kInf);
    EXPECT_EQ(st[2].argmax, 5);
    EXPECT_TRUE(st[3].has_nan);
  }
}

// ---------------------------------------------------------------- bf16 widened to fp32 GEMM

// The fp32 reference of a bf16 linear: the same bf16 inputs, widened, multiplied in fp32.
at::Tensor widened_reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return at::linear(x.to(at::kFloat), w.to(at::kFloat), b.defined() ? b.to(at::kFloat) : at::Tensor());
}

// widening_linear is the fp32 product of the bf16 inputs, rounded once: within one bf16 rounding
// of the fp32 reference, for row counts from 1 to beyond a panel, shapes with and without tails,
// batch dimensions and bias; float_out holds exactly the bf16 results.
TEST(WideningLinear, IsTheFp32ProductOfTheBf16InputsRoundedOnce) {
  at::manual_seed(11);
  for (int64_t m : {1, 3, 8, 9, 64, 300, 1100}) {
    for (auto [in, out] : {std::pair<int64_t, int64_t>{576, 1536}, {100, 37}, {40, 3000}}) {
      const at::Tensor x = at::randn({m, in}).to(at::kBFloat16), w = at::randn({out, in}).to(at::kBFloat16);
      const at::Tensor b = at::randn({out}).to(at::kBFloat16);
      for (const at::Tensor& bias : {b, at::Tensor()}) {
        const at::Tensor got = widening_linear(x, w, bias);
        const at::Tensor want = widened_reference(x, w, bias);
        ASSERT_EQ(got.scalar_type(), at::kBFloat16);
        ASSERT_EQ(got.sizes(), (std::vector<int64_t>{m, out}));
        // One rounding to bf16 (relative 2^-8 of each value) plus fp32 summation order.
        const at::Tensor err = (got.to(at::kFloat) - want).abs();
        EXPECT_TRUE((err <= want.abs() * (1.0 / 256) + 1e-3).all().item<bool>())
            << "m=" << m << " in=" << in << " out=" << out << " max err " << err.max().item<float>();
        EXPECT_TRUE(at::equal(widening_linear(x, w, bias, /*float_out=*/true), got.to(at::kFloat)));
      }
    }
  }
  // Leading batch dimensions are kept.
  const at::Tensor x3 = at::randn({2, 5, 64}).to(at::kBFloat16), w = at::randn({48, 64}).to(at::kBFloat16);
  const at::Tensor y3 = widening_linear(x3, w, at::Tensor());
  EXPECT_EQ(y3.sizes(), (std::vector<int64_t>{2, 5, 48}));
  EXPECT_TRUE(at::equal(y3.view({10, 48}), widening_linear(x3.view({10, 64}), w, at::Tensor())));
  EXPECT_ANY_THROW(widening_linear(x3.to(at::kFloat), w, at::Tensor()));  // bf16 only
  EXPECT_ANY_THROW(widening_linear(x3, w.narrow(1, 0, 32), at::Tensor()));
}

// ---------------------------------------------------------------- the packed bf16 GEMM

// packed_gemm_bf16 over features [0, n), called once per range between `cuts` (as threads
// split it); y bf16, or fp32 holding the bf16 values.
at::Tensor packed_gemm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool y_float,
                       std::vector<int64_t> cuts = {}) {
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0);
  at::Tensor y = at::full({m, n}, 7.0, at::TensorOptions().dtype(y_float ? at::kFloat : at::kBFloat16));
  const at::Tensor bf = bias.defined() ? bias.to(at::kFloat).contiguous() : at::Tensor();
  const at::Tensor xc = x.contiguous(), wc = w.contiguous();
  const PackedGemmArgs a{xc.data_ptr<c10::BFloat16>(),
                         wc.data_ptr<c10::BFloat16>(),
                         bf.defined() ? bf.data_ptr<float>() : nullptr,
                         y.data_ptr(),
                         y_float,
                         m,
                         n,
                         k};
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(n);
  for (size_t i = 0; i + 1 < cuts.size(); ++i) packed_gemm_bf16(a, cuts[i], cuts[i + 1]);
  return y;
}

// Each result is the fp32 product of the bf16 inputs plus the bias, rounded once: within one
// bf16 rounding of the fp32 reference, for every tail of the 6-row x 16-feature tile (rows mod
// 6, features mod 16), shared dimensions below one vector, not a multiple of 8, and over several
// passes, row counts beyond one packed block (144) and one pass over the partial sums (512),
// features beyond one packed block (512). y_float holds exactly the bf16 results. At the base
// level this runs the scalar copy (the same sums in the same order).
TEST(PackedGemm, IsTheFp32ProductRoundedOnceForEveryTail) {
  at::manual_seed(21);
  for (int64_t m : {1, 5, 6, 7, 13, 150, 600}) {
    for (auto [k, n] :
         {std::pair<int64_t, int64_t>{576, 192}, {7, 37}, {8, 16}, {321, 17}, {1536, 40}, {700, 530}}) {
      const at::Tensor x = at::randn({m, k}).to(at::kBFloat16), w = at::randn({n, k}).to(at::kBFloat16);
      const at::Tensor b = at::randn({n}).to(at::kBFloat16);
      for (const at::Tensor& bias : {b, at::Tensor()}) {
        const at::Tensor got = packed_gemm(x, w, bias, false);
        const at::Tensor want = widened_reference(x, w, bias);
        const at::Tensor err = (got.to(at::kFloat) - want).abs();
        EXPECT_TRUE((err <= want.abs() * (1.0 / 256) + 1e-3).all().item<bool>())
            << "m=" << m << " k=" << k << " n=" << n << " max err " << err.max().item<float>();
        EXPECT_TRUE(at::equal(packed_gemm(x, w, bias, true), got.to(at::kFloat))) << "m=" << m << " k=" << k;
      }
    }
  }
}

// The sums run in a fixed order per result: the same bits whichever features a call covers
// (a split at a multiple of 16 or not), whichever other rows share the call, and however many
// rows there are (one, a few, past a packed block). A NaN input spoils its own row only, and
// an infinite weight its own feature (rounded as c10::BFloat16 rounds: NaN, ±inf).
TEST(PackedGemm, EachResultIsIndependentOfTheSplitAndOfTheOtherRows) {
  at::manual_seed(22);
  const int64_t k = 700, n = 530;
  const at::Tensor x = at::randn({600, k}).to(at::kBFloat16), w = at::randn({n, k}).to(at::kBFloat16);
  const at::Tensor b = at::randn({n}).to(at::kBFloat16);
  const at::Tensor whole = packed_gemm(x, w, b, false);
  EXPECT_TRUE(at::equal(packed_gemm(x, w, b, false, {16, 100, 517}), whole));
  EXPECT_TRUE(at::equal(packed_gemm(x, w, b, false, {1, 2, 3}), whole));
  for (auto [from, rows] : {std::pair<int64_t, int64_t>{37, 1}, {30, 20}, {140, 9}, {0, 145}, {500, 100}}) {
    const at::Tensor part = packed_gemm(x.narrow(0, from, rows), w, b, false);
    EXPECT_TRUE(at::equal(part, whole.narrow(0, from, rows))) << from << " + " << rows << " rows";
  }
  at::Tensor xs = x.narrow(0, 0, 8).clone(), ws = w.narrow(0, 0, 40).clone();
  xs[2][5] = std::numeric_limits<float>::quiet_NaN();
  ws[17][3] = std::numeric_limits<float>::infinity();
  const at::Tensor y = packed_gemm(xs, ws, at::Tensor(), false).to(at::kFloat);
  const at::Tensor want = widened_reference(xs, ws, at::Tensor()).to(at::kBFloat16).to(at::kFloat);
  EXPECT_TRUE(y[2].isnan().all().item<bool>());
  EXPECT_TRUE(at::equal(y.select(1, 17).isnan(), want.select(1, 17).isnan()));
  EXPECT_TRUE(at::equal(y.select(1, 17).isinf(), want.select(1, 17).isinf()));
  at::Tensor finite = at::ones({8, 40}, at::kBool);
  finite[2].fill_(false);
  finite.select(1, 17).fill_(false);
  EXPECT_TRUE(at::isfinite(y).masked_select(finite).all().item<bool>());
  // No shared dimension: the bias alone, rounded.
  const at::Tensor none = packed_gemm(at::zeros({3, 0}, at::kBFloat16), at::zeros({5, 0}, at::kBFloat16),
                                      b.narrow(0, 0, 5), false);
  EXPECT_TRUE(at::equal(none, b.narrow(0, 0, 5).expand({3, 5})));
}

// model_linear's gradients on the widening path are linear's gradients computed in fp32 from the
// bf16 values (the backward's GEMMs widened the same way), each rounded once to bf16; on other
// CPUs model_linear is at::linear. Either way they match the fp32 autograd reference.
TEST(WideningLinear, ModelLinearGradientsMatchTheFp32Reference) {
  at::manual_seed(12);
  for (bool with_bias : {true, false}) {
    const at::Tensor x0 = at::randn({3, 70, 96}).to(at::kBFloat16),
                     w0 = at::randn({200, 96}).to(at::kBFloat16);
    const at::Tensor b0 = at::randn({200}).to(at::kBFloat16), g = at::randn({3, 70, 200}).to(at::kBFloat16);
    const at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    const at::Tensor b = with_bias ? b0.clone().requires_grad_(true) : at::Tensor();
    const at::Tensor y = model_linear(x, w, b);
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    y.backward(g);
    const at::Tensor xr = x0.to(at::kFloat).requires_grad_(true), wr = w0.to(at::kFloat).requires_grad_(true);
    const at::Tensor br = with_bias ? b0.to(at::kFloat).requires_grad_(true) : at::Tensor();
    at::linear(xr, wr, br).backward(g.to(at::kFloat));
    auto close = [](const at::Tensor& got, const at::Tensor& want, const char* what) {
      const at::Tensor err = (got.to(at::kFloat) - want).abs();
      // bf16 backward on the native path rounds its inputs too: 2 bf16 ulps of the largest value.
      EXPECT_LT(err.max().item<float>(), want.abs().max().item<float>() * (2.0 / 256)) << what;
    };
    close(x.grad(), xr.grad(), "grad x");
    close(w.grad(), wr.grad(), "grad w");
    if (with_bias) close(b.grad(), br.grad(), "grad b");
    EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
    EXPECT_EQ(w.grad().scalar_type(), at::kBFloat16);
  }
  // linear_grad_input / linear_grad_weight: the backward's GEMMs for hand-written backward passes.
  const at::Tensor gy = at::randn({33, 300}).to(at::kBFloat16), w = at::randn({300, 64}).to(at::kBFloat16);
  const at::Tensor x = at::randn({33, 64}).to(at::kBFloat16);
  EXPECT_LT(max_rel(linear_grad_input(gy, w), gy.to(at::kFloat).mm(w.to(at::kFloat))), 1e-2);
  EXPECT_LT(max_rel(linear_grad_weight(gy, x), gy.to(at::kFloat).t().mm(x.to(at::kFloat))), 1e-2);
  EXPECT_LT(max_rel(model_matmul(gy.view({3, 11, 300}), w),
                    at::matmul(gy.view({3, 11, 300}).to(at::kFloat), w.to(at::kFloat))),
            1e-2);
}

// The split fp32 GEMMs (the engine's thread plan: OpenBLAS at one thread, each GEMM split over
// libtorch's OpenMP threads) compute linear and matmul, forward and backward, as libtorch does:
// the same products over the same inner dimension, so within fp32 summation-order noise. Off
// (no plan set), model_linear is at::linear itself.
TEST(SplitGemm, ModelLinearMatmulAndGradientsMatchLibtorch) {
  struct Restore {
    int threads = small_linear_threads();
    ~Restore() {
      set_cpu_gemm_splits(false);
      set_small_linear_threads(threads);
    }
  } restore;
  at::manual_seed(13);
  const at::Tensor x0 = at::randn({3, 70, 96}), w0 = at::randn({200, 96}), b0 = at::randn({200});
  const at::Tensor g = at::randn({3, 70, 200});
  set_cpu_gemm_splits(false);
  EXPECT_FALSE(splits(x0));
  EXPECT_TRUE(at::equal(model_linear(x0, w0, b0), at::linear(x0, w0, b0)));

  set_cpu_gemm_splits(true);
  set_small_linear_threads(2);
  EXPECT_TRUE(splits(x0));
  EXPECT_FALSE(splits(x0.to(at::kBFloat16)));
  for (bool with_bias : {true, false}) {
    const at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    const at::Tensor b = with_bias ? b0.clone().requires_grad_(true) : at::Tensor();
    const at::Tensor y = model_linear(x, w, b);
    y.backward(g);
    const at::Tensor xr = x0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(true);
    const at::Tensor br = with_bias ? b0.clone().requires_grad_(true) : at::Tensor();
    const at::Tensor yr = at::linear(xr, wr, br);
    yr.backward(g);
    EXPECT_EQ(y.sizes(), yr.sizes());
    EXPECT_LT(max_rel(y, yr), 1e-5);
    EXPECT_LT(max_rel(x.grad(), xr.grad()), 1e-5);
    EXPECT_LT(max_rel(w.grad(), wr.grad()), 1e-5);
    if (with_bias) {
      EXPECT_LT(max_rel(b.grad(), br.grad()), 1e-5);
    }
  }
  // Without gradients: every row count from one to many, outputs not a multiple of 16.
  for (int64_t m : {1, 5, 64, 700}) {
    const at::Tensor x = at::randn({m, 40}), w = at::randn({37, 40});
    EXPECT_LT(max_rel(split_linear(x, w, at::Tensor()), at::linear(x, w)), 1e-5) << m;
  }
  EXPECT_ANY_THROW(split_linear(x0.to(at::kBFloat16), w0, at::Tensor()));
  EXPECT_ANY_THROW(split_linear(x0, w0.narrow(1, 0, 32), at::Tensor()));

  // Attention's batched matmuls (non-contiguous views, as attend passes them), with gradients.
  const at::Tensor q0 = at::randn({2, 3, 64, 5}).transpose(2, 3), k0 = at::randn({2, 3, 64, 40});
  const at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
  const at::Tensor qr = q0.clone().requires_grad_(true), kr = k0.clone().requires_grad_(true);
  const at::Tensor s = model_matmul(q, k), sr = at::matmul(qr, kr);
  EXPECT_EQ(s.sizes(), sr.sizes());
  EXPECT_LT(max_rel(s, sr), 1e-5);
  const at::Tensor gs = at::randn(sr.sizes());
  s.backward(gs);
  sr.backward(gs);
  EXPECT_LT(max_rel(q.grad(), qr.grad()), 1e-5);
  EXPECT_LT(max_rel(k.grad(), kr.grad()), 1e-5);
  // Broadcasting batch shapes are at::matmul's.
  const at::Tensor a = at::randn({4, 6, 8}), m2 = at::randn({8, 3});
  EXPECT_TRUE(at::equal(model_matmul(a, m2), at::matmul(a, m2)));

  // The hand-written backward's GEMMs.
  const at::Tensor gy = at::randn({33, 300}), wl = at::randn({300, 64}), xl = at::randn({33, 64});
  EXPECT_LT(max_rel(linear_grad_input(gy, wl), gy.mm(wl)), 1e-5);
  EXPECT_LT(max_rel(linear_grad_weight(gy, xl), gy.t().mm(xl)), 1e-5);
}

// The path follows the CPU level: widening exactly when there is no AVX512_BF16 (SWARM_CPU_LEVEL
// included), and only for bf16 CPU tensors.
TEST(WideningLinear, TheWideningPathFollowsTheCpuLevel) {
  EXPECT_EQ(bf16_matmul_widens(), !cpu_has_avx512_bf16());
  EXPECT_EQ(widens(at::zeros({2}, at::kBFloat16)), bf16_matmul_widens());
  EXPECT_FALSE(widens(at::zeros({2}, at::kFloat)));
  EXPECT_FALSE(widens(at::Tensor()));
}

// The switches that make a machine behave as a lower level for the libraries, not only for our
// kernels (run by the cpu_level_* ctest variants, which set them): oneDNN must run no higher than
// DNNL_MAX_CPU_ISA allows, and ATen's kernels at the level ATEN_CPU_CAPABILITY forces, each as the
// library itself reports it (oneDNN's effective ISA; ATen's show_config()).
TEST(WideningLinear, TheLibrariesHonourTheirIsaSwitches) {
  const char* dnnl = std::getenv("DNNL_MAX_CPU_ISA");
  const char* aten = std::getenv("ATEN_CPU_CAPABILITY");
  if (dnnl == nullptr && aten == nullptr)
    GTEST_SKIP() << "neither DNNL_MAX_CPU_ISA nor ATEN_CPU_CAPABILITY set (set by the cpu_level_* variants)";
  (void)at::matmul(at::randn({8, 8}).to(at::kBFloat16),
                   at::randn({8, 8}).to(at::kBFloat16));  // oneDNN initialised
  if (dnnl != nullptr && onednn_cpu_isa() != "not loaded") {
    const std::string isa = onednn_cpu_isa();
    const std::string want = dnnl;
    if (want == "AVX2") {
      EXPECT_TRUE(isa == "avx2" || isa == "avx" || isa == "sse41") << "oneDNN runs " << isa;
    }
    if (want == "SSE41") {
      EXPECT_EQ(isa, "sse41");
    }
    if (want == "AVX512_CORE") {
      EXPECT_EQ(isa.find("bf16"), std::string::npos) << "oneDNN runs " << isa;
    }
  }
  if (aten != nullptr) {
    const std::string want = aten;
    if (want == "avx2") {
      EXPECT_EQ(aten_cpu_capability(), "AVX2");
    }
    if (want == "default") {
      EXPECT_EQ(aten_cpu_capability(), "NO AVX");
    }
  }
}

// Without the switches the libraries report a level this CPU has: oneDNN runs bf16 dot products
// exactly where our kernels do (both read the CPU's flags), and ATen names one of its levels.
TEST(WideningLinear, TheLibrariesReportTheirLevels) {
  if (std::getenv("DNNL_MAX_CPU_ISA") == nullptr && std::getenv("SWARM_CPU_LEVEL") == nullptr &&
      onednn_cpu_isa() != "not loaded") {
    EXPECT_EQ(onednn_cpu_isa().find("avx512_core_bf16") != std::string::npos ||
                  onednn_cpu_isa().find("amx") != std::string::npos,
              cpu_has_avx512_bf16())
        << "oneDNN runs " << onednn_cpu_isa();
  }
  const std::string aten = aten_cpu_capability();
  EXPECT_TRUE(aten == "NO AVX" || aten == "AVX" || aten == "AVX2" || aten == "AVX512") << aten;
}

}  // namespace
}  // namespace swarm
