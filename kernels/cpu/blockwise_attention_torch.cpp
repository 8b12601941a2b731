#include "kernels/cpu/blockwise_attention_torch.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include <torch/csrc/autograd/custom_function.h>

#include "common/error.hpp"
#include "kernels/cpu/widening_linear_torch.hpp"

namespace swarm {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct Shape {
  int64_t n = 0, heads = 0, kv_heads = 0, rep = 0, head_dim = 0;
};

Shape check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::vector<int64_t>& cu_seqlens, int64_t window, int64_t block) {
  SWARM_REQUIRE(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, ErrorKind::INVALID_ARGUMENT,
                "blockwise_attention: q, k and v must be [tokens, heads, head_dim]");
  Shape s{q.size(0), q.size(1), k.size(1), 0, q.size(2)};
  SWARM_REQUIRE(k.size(0) == s.n && v.size(0) == s.n && v.size(1) == s.kv_heads && k.size(2) == s.head_dim &&
                    v.size(2) == s.head_dim,
                ErrorKind::INVALID_ARGUMENT, "blockwise_attention: q, k and v disagree in shape");
  SWARM_REQUIRE(s.kv_heads > 0 && s.heads % s.kv_heads == 0, ErrorKind::INVALID_ARGUMENT,
                "blockwise_attention: heads must be a multiple of kv heads");
  SWARM_REQUIRE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                ErrorKind::INVALID_ARGUMENT, "blockwise_attention: q, k and v must share a dtype");
  SWARM_REQUIRE(window >= 0 && block >= 1, ErrorKind::INVALID_ARGUMENT,
                "blockwise_attention: window must be >= 0 and the block >= 1");
  SWARM_REQUIRE(
      cu_seqlens.size() >= 2 && cu_seqlens.front() == 0 && cu_seqlens.back() == s.n,
      ErrorKind::INVALID_ARGUMENT,
      "blockwise_attention: sample boundaries must run from 0 to the " + std::to_string(s.n) + " tokens");
  for (size_t i = 1; i < cu_seqlens.size(); ++i)
    SWARM_REQUIRE(cu_seqlens[i] > cu_seqlens[i - 1], ErrorKind::INVALID_ARGUMENT,
                  "blockwise_attention: sample boundaries must increase (no empty sample)");
  s.rep = s.heads / s.kv_heads;
  return s;
}

// a · b in fp32: split over the OpenMP threads on the CPU (model_matmul), at::matmul elsewhere.
at::Tensor fmm(const at::Tensor& a, const at::Tensor& b) { return model_matmul(a, b); }

// Query-head rows [rows, heads, hd] -> fp32 [kv_heads, rep * rows, hd]: the query heads that
// share a kv head stacked (head h = kv * rep + r; row r * rows + i), so one batched matmul per kv
// head serves all of them.
at::Tensor query_groups(const at::Tensor& t, const Shape& s) {
  const int64_t rows = t.size(0);
  return t.to(at::kFloat)
      .view({rows, s.kv_heads, s.rep, s.head_dim})
      .permute({1, 2, 0, 3})
      .reshape({s.kv_heads, s.rep * rows, s.head_dim});
}

// The inverse of query_groups: [kv_heads, rep * rows, hd] -> [rows, heads, hd].
at::Tensor query_rows(const at::Tensor& g, int64_t rows, const Shape& s) {
  return g.view({s.kv_heads, s.rep, rows, s.head_dim})
      .permute({2, 0, 1, 3})
      .reshape({rows, s.heads, s.head_dim});
}

// Key/value rows [rows, kv_heads, hd] -> fp32 [kv_heads, rows, hd].
at::Tensor kv_groups(const at::Tensor& t) { return t.to(at::kFloat).permute({1, 0, 2}).contiguous(); }

// Blocks key positions j of query positions i (both within the sample) where j > i, or
// i - j >= window; applied to scores [kv_heads, rep * bq, bk] as -inf. No-op when every pair is
// allowed.
void mask_block(at::Tensor& scores, int64_t q0, int64_t bq, int64_t k0, int64_t bk, int64_t window,
                const Shape& s) {
  const bool future = k0 + bk - 1 > q0;                         // some key after some query
  const bool far = window > 0 && (q0 + bq - 1) - k0 >= window;  // some key out of some query's window
  if (!future && !far) return;
  const auto opts = at::TensorOptions().dtype(at::kLong).device(scores.device());
  const at::Tensor i = at::arange(q0, q0 + bq, opts).view({bq, 1});
  const at::Tensor j = at::arange(k0, k0 + bk, opts).view({1, bk});
  at::Tensor blocked = j > i;
  if (window > 0) blocked = blocked.logical_or((i - j) >= window);
  scores.view({s.kv_heads, s.rep, bq, bk}).masked_fill_(blocked, kNegInf);
}

// The key range of the query block [q0, q1) of one sample: from the window's start (or 0) to the
// block's last query.
std::pair<int64_t, int64_t> key_range(int64_t q0, int64_t q1, int64_t window) {
  return {window > 0 ? std::max<int64_t>(0, q0 - window + 1) : 0, q1};
}

struct Saved {
  std::vector<int64_t> cu_seqlens;
  int64_t window = 0, block = kAttentionBlock;
  double scale = 1.0;
};

struct BlockwiseAttentionFunction : public torch::autograd::Function<BlockwiseAttentionFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                                                const at::Tensor& k, const at::Tensor& v, const Saved& how) {
    BlockwiseAttentionOutput r =
        blockwise_attention_forward(q, k, v, how.cu_seqlens, how.window, how.scale, how.block);
    ctx->save_for_backward({q, k, v, r.out, r.lse});
    ctx->saved_data["cu_seqlens"] = how.cu_seqlens;
    ctx->saved_data["window"] = how.window;
    ctx->saved_data["block"] = how.block;
    ctx->saved_data["scale"] = how.scale;
    return {r.out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::vector<int64_t> cu = ctx->saved_data["cu_seqlens"].toIntVector();
    BlockwiseAttentionGrads g = blockwise_attention_backward(
        grads[0], saved[0], saved[1], saved[2], saved[3], saved[4], cu, ctx->saved_data["window"].toInt(),
        ctx->saved_data["scale"].toDouble(), ctx->saved_data["block"].toInt());
    return {g.dq, g.dk, g.dv, at::Tensor()};
  }
};

}  // namespace

BlockwiseAttentionOutput blockwise_attention_forward(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v,
                                                     const std::vector<int64_t>& cu_seqlens, int64_t window,
                                                     double scale, int64_t block) {
  const Shape s = check_inputs(q, k, v, cu_seqlens, window, block);
  at::NoGradGuard no_grad;
  BlockwiseAttentionOutput r;
  r.out = at::empty({s.n, s.heads, s.head_dim}, q.options());
  r.lse = at::empty({s.heads, s.n}, q.options().dtype(at::kFloat));
  for (size_t seg = 0; seg + 1 < cu_seqlens.size(); ++seg) {
    const int64_t base = cu_seqlens[seg], len = cu_seqlens[seg + 1] - base;
    for (int64_t q0 = 0; q0 < len; q0 += block) {
      const int64_t bq = std::min(block, len - q0), rows = s.rep * bq;
      const at::Tensor qg =
          query_groups(q.narrow(0, base + q0, bq), s) * scale;  // may be a view of q: not in place
      at::Tensor m = at::full({s.kv_heads, rows}, kNegInf, qg.options());
      at::Tensor l = at::zeros({s.kv_heads, rows}, qg.options());
      at::Tensor acc = at::zeros({s.kv_heads, rows, s.head_dim}, qg.options());
      const auto [k_lo, k_hi] = key_range(q0, q0 + bq, window);
      for (int64_t k0 = k_lo; k0 < k_hi; k0 += block) {
        const int64_t bk = std::min(block, k_hi - k0);
        const at::Tensor kg = kv_groups(k.narrow(0, base + k0, bk));
        const at::Tensor vg = kv_groups(v.narrow(0, base + k0, bk));
        at::Tensor scores = fmm(qg, kg.transpose(1, 2).contiguous());  // [kv, rows, bk]
        mask_block(scores, q0, bq, k0, bk, window, s);
        const at::Tensor m_new = at::maximum(m, std::get<0>(scores.max(-1)));
        // A row with no allowed key yet (a window's first blocks) keeps m = -inf: exponentiate
        // against 0 there, so it contributes exp(-inf) = 0 rather than NaN.
        const at::Tensor m_safe = m_new.masked_fill(at::isinf(m_new), 0.0);
        const at::Tensor p = scores.sub_(m_safe.unsqueeze(-1)).exp_();
        const at::Tensor alpha = (m - m_safe).exp_();
        l.mul_(alpha).add_(p.sum(-1));
        acc.mul_(alpha.unsqueeze(-1)).add_(fmm(p, vg));
        m = m_new;
      }
      // Every query sees at least itself, so l > 0.
      acc.div_(l.unsqueeze(-1));
      r.out.narrow(0, base + q0, bq).copy_(query_rows(acc, bq, s));
      r.lse.narrow(1, base + q0, bq).copy_((m + l.log()).view({s.heads, bq}));
    }
  }
  return r;
}

BlockwiseAttentionGrads blockwise_attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                                     const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse,
                                                     const std::vector<int64_t>& cu_seqlens, int64_t window,
                                                     double scale, int64_t block) {
  const Shape s = check_inputs(q, k, v, cu_seqlens, window, block);
  SWARM_REQUIRE(dout.sizes() == q.sizes() && out.sizes() == q.sizes() && lse.dim() == 2 &&
                    lse.size(0) == s.heads && lse.size(1) == s.n,
                ErrorKind::INVALID_ARGUMENT, "blockwise_attention_backward: gradient or saved shapes differ");
  at::NoGradGuard no_grad;
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor dq = at::empty({s.n, s.heads, s.head_dim}, f32);
  at::Tensor dk = at::zeros({s.n, s.kv_heads, s.head_dim}, f32);
  at::Tensor dv = at::zeros({s.n, s.kv_heads, s.head_dim}, f32);
  // D = rowsum(dO ∘ O) per query row and head: [N, heads] -> [heads, N] (lse's layout).
  const at::Tensor d_all = (dout.to(at::kFloat) * out.to(at::kFloat)).sum(-1).t().contiguous();
  for (size_t seg = 0; seg + 1 < cu_seqlens.size(); ++seg) {
    const int64_t base = cu_seqlens[seg], len = cu_seqlens[seg + 1] - base;
    for (int64_t q0 = 0; q0 < len; q0 += block) {
      const int64_t bq = std::min(block, len - q0), rows = s.rep * bq;
      const at::Tensor qg =
          query_groups(q.narrow(0, base + q0, bq), s) * scale;  // may be a view of q: not in place
      const at::Tensor dog = query_groups(dout.narrow(0, base + q0, bq), s);
      const at::Tensor lse_g = lse.narrow(1, base + q0, bq).reshape({s.kv_heads, rows, 1});
      const at::Tensor d_g = d_all.narrow(1, base + q0, bq).reshape({s.kv_heads, rows, 1});
      at::Tensor dqg = at::zeros({s.kv_heads, rows, s.head_dim}, f32);
      const auto [k_lo, k_hi] = key_range(q0, q0 + bq, window);
      for (int64_t k0 = k_lo; k0 < k_hi; k0 += block) {
        const int64_t bk = std::min(block, k_hi - k0);
        const at::Tensor kg = kv_groups(k.narrow(0, base + k0, bk));
        const at::Tensor vg = kv_groups(v.narrow(0, base + k0, bk));
        at::Tensor scores = fmm(qg, kg.transpose(1, 2).contiguous());
        mask_block(scores, q0, bq, k0, bk, window, s);
        const at::Tensor p = scores.sub_(lse_g).exp_();  // the forward's probabilities; 0 where blocked
        const at::Tensor pt = p.transpose(1, 2).contiguous();
        dv.narrow(0, base + k0, bk).add_(fmm(pt, dog).permute({1, 0, 2}));
        const at::Tensor dp = fmm(dog, vg.transpose(1, 2).contiguous());
        const at::Tensor ds = dp.sub_(d_g).mul_(p);  // P ∘ (dP - D)
        dqg.add_(fmm(ds, kg));
        dk.narrow(0, base + k0, bk).add_(fmm(ds.transpose(1, 2).contiguous(), qg).permute({1, 0, 2}));
      }
      dq.narrow(0, base + q0, bq).copy_(query_rows(dqg.mul_(scale), bq, s));
    }
  }
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

at::Tensor blockwise_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::vector<int64_t>& cu_seqlens, int64_t window, double scale,
                               int64_t block) {
  check_inputs(q, k, v, cu_seqlens, window, block);
  return BlockwiseAttentionFunction::apply(q, k, v, Saved{cu_seqlens, window, block, scale})[0];
}

}  // namespace swarm
