#include "kernels/cpu/paged_attention_torch.hpp"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <memory>

#include "common/error.hpp"
#include "kernels/cpu/cpu_dispatch.hpp"
#include "kernels/cpu/serving_ops_torch.hpp"
#include "kernels/cpu/paged_attention_kernels.inc"

namespace swarm {
#if SWARM_HAVE_X86_KERNELS
namespace paged_attention_detail {
// bf16 scores as dot products (paged_attention_bf16dot_torch.cpp).
void run_range_bf16_dot(const Args& a, int64_t begin, int64_t end);
}  // namespace paged_attention_detail
#endif

namespace {

// Multiply-adds a thread should get before a region is worth starting (measured on TinyStories,
// 2 cores: at batch 1 every attention region cost more than its arithmetic).
constexpr int64_t kAttentionMinWorkPerThread = 1 << 18;

// One copy per instruction set (cpu_dispatch.hpp).
SWARM_KERNEL_COPIES(attention_range, Args, run_range)

// A query with more visible keys than this has them split into parts of about equal size
// (multiples of 16 keys), each a unit of its own, merged afterwards (merge_parts): batch 1 at
// a long context then keeps every thread busy, where its kv_heads units alone (3 for SmolLM2)
// left one of two threads idle a third of the time. The parts depend on the query's key count
// only, never on the batch or the thread count, so a sequence's result is the same bits alone
// or in any batch. Up to this many keys nothing changes (one unit, normalised in place).
constexpr int64_t kKeysPerPart = 1024;

struct Merge {
  int64_t b, g, first_split, parts;
};

// The result of a query head split over parts: with m_p, l_p, s_p its maximum score, sum of
// exponentials and unnormalised value sums in part p, and M the largest m_p, the attention is
// sum_p e^(m_p - M) s_p / sum_p e^(m_p - M) l_p (parts in order).
template <class T>
void merge_parts(const Args& a, const std::vector<KeySplit>& splits, const Merge& m) {
  const int64_t rep = a.heads / a.kv_heads, hd = a.head_dim;
  T* out = static_cast<T*>(a.out) + (m.b * a.heads + m.g * rep) * hd;
  std::vector<float> sum(static_cast<size_t>(hd));
  for (int64_t r = 0; r < rep; ++r) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < m.parts; ++p) {
      const auto part =
          partial_out(a.partial + splits[static_cast<size_t>(m.first_split + p)].partial, rep, hd);
      top = std::max(top, part.max[r]);
    }
    float total = 0.f;
    std::fill(sum.begin(), sum.end(), 0.f);
    for (int64_t p = 0; p < m.parts; ++p) {
      const auto part =
          partial_out(a.partial + splits[static_cast<size_t>(m.first_split + p)].partial, rep, hd);
      const float w = std::exp(part.max[r] - top);
      total += w * part.total[r];
      const float* s = part.sums + r * hd;
      for (int64_t i = 0; i < hd; ++i) sum[static_cast<size_t>(i)] += w * s[i];
    }
    const float inv = 1.f / total;
    for (int64_t i = 0; i < hd; ++i) out[r * hd + i] = static_cast<T>(sum[static_cast<size_t>(i)] * inv);
  }
}

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const PagedContext& context, int64_t window, double scale,
                                  const at::Tensor& out_buffer) {
  // Named in profiles (bench_inference --profile-ops), where it is not an aten op.
  RECORD_FUNCTION("swarm::paged_decode_attention", c10::ArrayRef<const c10::IValue>{});
  SWARM_CHECK(
      q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
      "paged_decode_attention: q must be [B, heads, hd] and the caches [blocks, block, kv_heads, hd]");
  SWARM_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "paged_decode_attention: CPU tensors only");
  SWARM_CHECK(q.scalar_type() == k_cache.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_decode_attention: q and the caches must share a dtype");
  SWARM_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_decode_attention: contiguous tensors only");
  const int64_t B = q.size(0), heads = q.size(1), hd = q.size(2);
  const int64_t kvh = k_cache.size(2);
  SWARM_CHECK(k_cache.size(3) == hd && kvh > 0 && heads % kvh == 0,
              "paged_decode_attention: head shapes differ");
  SWARM_CHECK(static_cast<int64_t>(context.lengths.size()) == B,
              "paged_decode_attention: one length per query");
  const int64_t tables = static_cast<int64_t>(context.table_offset.size()) - 1;
  SWARM_CHECK(
      context.table_index.empty() ? tables == B : static_cast<int64_t>(context.table_index.size()) == B,
      "paged_decode_attention: context does not give every query a block table");
  const int64_t bs = k_cache.size(1);
  const int64_t visible_max = std::max<int64_t>(1, window);
  std::vector<int64_t> keys_of(static_cast<size_t>(B));  // keys each query reads
  int64_t keys = 0;                                      // over every query
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = context.lengths[static_cast<size_t>(b)];
    const int64_t t = context.table_index.empty() ? b : context.table_index[static_cast<size_t>(b)];
    SWARM_CHECK(t >= 0 && t < tables, "paged_decode_attention: a query's block table is out of range");
    const int64_t blocks =
        context.table_offset[static_cast<size_t>(t) + 1] - context.table_offset[static_cast<size_t>(t)];
    SWARM_CHECK(len >= 1 && len <= blocks * bs,
                "paged_decode_attention: a sequence's length exceeds its blocks");
    keys_of[static_cast<size_t>(b)] = std::min(len, visible_max);
    keys += keys_of[static_cast<size_t>(b)];
  }

  at::Tensor out = output_tensor(out_buffer, {B, heads * hd}, q.scalar_type(), "paged_decode_attention",
                                 {&q, &k_cache, &v_cache});
  Args a{q.data_ptr(),
         k_cache.data_ptr(),
         v_cache.data_ptr(),
         out.data_ptr(),
         &context,
         heads,
         kvh,
         hd,
         bs,
         std::max<int64_t>(1, window),
         static_cast<float>(scale),
         nullptr,
         nullptr};
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  SWARM_CHECK(bf16 || q.scalar_type() == at::kFloat, "paged_decode_attention: fp32 or bf16 only");
  attention_range_fn run = attention_range(bf16);
#if SWARM_HAVE_X86_KERNELS
  if (bf16 && cpu_has_avx512_bf16() && (hd == 32 || hd == 64 || hd == 128 || hd == 256)) {
    run = paged_attention_detail::run_range_bf16_dot;
  }
#endif
  // Long contexts split into parts (kKeysPerPart); the units, and the keys each reads.
  const int64_t rep = heads / kvh;
  std::vector<KeySplit> splits;
  std::vector<Merge> merges;
  std::unique_ptr<float[]> partial;  // every part writes all of its floats: no zero fill
  std::vector<int64_t> unit_keys;
  const bool split = std::any_of(keys_of.begin(), keys_of.end(), [](int64_t k) { return k > kKeysPerPart; });
  if (split) {
    int64_t floats = 0;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t n = keys_of[static_cast<size_t>(b)];
      const int64_t parts = n <= kKeysPerPart ? 1 : (n + kKeysPerPart - 1) / kKeysPerPart;
      for (int64_t g = 0; g < kvh; ++g) {
        if (parts == 1) {
          splits.push_back({b, g, 0, -1, -1});
          unit_keys.push_back(n);
          continue;
        }
        merges.push_back({b, g, static_cast<int64_t>(splits.size()), parts});
        for (int64_t p = 0; p < parts; ++p) {
          const int64_t begin = n * p / parts / 16 * 16,
                        end = p + 1 == parts ? n : n * (p + 1) / parts / 16 * 16;
          splits.push_back({b, g, begin, end, floats});
          unit_keys.push_back(end - begin);
          floats += rep * hd + 2 * rep;
        }
      }
    }
    partial.reset(new float[static_cast<size_t>(floats)]);
    a.splits = splits.data();
    a.partial = partial.get();
  }
  const int64_t units = split ? static_cast<int64_t>(splits.size()) : B * kvh;
  const auto keys_of_unit = [&](int64_t u) {
    return split ? unit_keys[static_cast<size_t>(u)] : keys_of[static_cast<size_t>(u / kvh)];
  };
  const auto merge_all = [&] {
    if (merges.empty()) return;
    at::parallel_for(0, static_cast<int64_t>(merges.size()), 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (bf16) {
          merge_parts<c10::BFloat16>(a, splits, merges[static_cast<size_t>(i)]);
        } else {
          merge_parts<float>(a, splits, merges[static_cast<size_t>(i)]);
        }
      }
    });
  };

  // Threads only for work that outweighs waking them (several microseconds a region here): a
  // unit costs ~2 * keys * head_dim * (heads / kvh) multiply-adds. The units are cut into one
  // run per thread of about equal keys (a prompt chunk's queries read from 1 to all of its
  // keys, so equal counts of units would not be equal work); each unit is computed by one
  // thread in the same order whatever the split.
  const int64_t per_key = 2 * hd * rep;
  const int threads = at::get_num_threads();
  if (threads <= 1 || keys * kvh * per_key < 2 * kAttentionMinWorkPerThread) {
    run(a, 0, units);
    merge_all();
    return out;
  }
  const int64_t parts =
      std::min<int64_t>({threads, units, keys * kvh * per_key / kAttentionMinWorkPerThread});
  std::vector<int64_t> cut(static_cast<size_t>(parts) + 1, units);
  cut[0] = 0;
  int64_t done = 0, part = 1;
  for (int64_t u = 0; u < units && part < parts; ++u) {
    done += keys_of_unit(u);
    if (done * parts >= part * keys * kvh) cut[static_cast<size_t>(part++)] = u + 1;
  }
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p)
      run(a, cut[static_cast<size_t>(p)], cut[static_cast<size_t>(p) + 1]);
  });
  merge_all();
  return out;
}

}  // namespace swarm
