#include "kernels/cpu/paged_attention_torch.hpp"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

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

}  // namespace

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const PagedContext& context, int64_t window, double scale,
                                  const at::Tensor& out_buffer) {
  // Named in profiles (bench_inference --profile-ops), where it is not an aten op.
  RECORD_FUNCTION("swarm::paged_decode_attention", c10::ArrayRef<const c10::IValue>{});
  SWARM_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_decode_attention: q must be [B, heads, hd] and the caches [blocks, block, kv_heads, hd]");
  SWARM_CHECK(q.device().is_cpu() && k_cache.device().is_cpu(), "paged_decode_attention: CPU tensors only");
  SWARM_CHECK(q.scalar_type() == k_cache.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type(),
              "paged_decode_attention: q and the caches must share a dtype");
  SWARM_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "paged_decode_attention: contiguous tensors only");
  const int64_t B = q.size(0), heads = q.size(1), hd = q.size(2);
  const int64_t kvh = k_cache.size(2);
  SWARM_CHECK(k_cache.size(3) == hd && kvh > 0 && heads % kvh == 0, "paged_decode_attention: head shapes differ");
  SWARM_CHECK(static_cast<int64_t>(context.lengths.size()) == B, "paged_decode_attention: one length per query");
  const int64_t tables = static_cast<int64_t>(context.table_offset.size()) - 1;
  SWARM_CHECK(context.table_index.empty() ? tables == B : static_cast<int64_t>(context.table_index.size()) == B,
              "paged_decode_attention: context does not give every query a block table");
  const int64_t bs = k_cache.size(1);
  const int64_t visible_max = std::max<int64_t>(1, window);
  std::vector<int64_t> keys_of(static_cast<size_t>(B));  // keys each query reads
  int64_t keys = 0;                                      // over every query
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = context.lengths[static_cast<size_t>(b)];
    const int64_t t = context.table_index.empty() ? b : context.table_index[static_cast<size_t>(b)];
    SWARM_CHECK(t >= 0 && t < tables, "paged_decode_attention: a query's block table is out of range");
    const int64_t blocks = context.table_offset[static_cast<size_t>(t) + 1] - context.table_offset[static_cast<size_t>(t)];
    SWARM_CHECK(len >= 1 && len <= blocks * bs, "paged_decode_attention: a sequence's length exceeds its blocks");
    keys_of[static_cast<size_t>(b)] = std::min(len, visible_max);
    keys += keys_of[static_cast<size_t>(b)];
  }

  at::Tensor out = output_tensor(out_buffer, {B, heads * hd}, q.scalar_type(), "paged_decode_attention",
                                 {&q, &k_cache, &v_cache});
  Args a{q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), &context, heads, kvh, hd, bs,
         std::max<int64_t>(1, window), static_cast<float>(scale)};
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  SWARM_CHECK(bf16 || q.scalar_type() == at::kFloat, "paged_decode_attention: fp32 or bf16 only");
  attention_range_fn run = attention_range(bf16);
#if SWARM_HAVE_X86_KERNELS
  if (bf16 && cpu_has_avx512_bf16() && (hd == 32 || hd == 64 || hd == 128 || hd == 256)) {
    run = paged_attention_detail::run_range_bf16_dot;
  }
#endif
  // Threads only for work that outweighs waking them (several microseconds a region here): a
  // (query, kv head) unit costs ~2 * keys * head_dim * (heads / kvh) multiply-adds. The units
  // are cut into one run per thread of about equal keys (a prompt chunk's queries read from 1
  // to all of its keys, so equal counts of units would not be equal work); each unit is
  // computed by one thread in the same order whatever the split.
  const int64_t per_key = 2 * hd * (heads / kvh);
  const int threads = at::get_num_threads();
  if (threads <= 1 || keys * kvh * per_key < 2 * kAttentionMinWorkPerThread) {
    run(a, 0, B * kvh);
    return out;
  }
  const int64_t parts = std::min<int64_t>({threads, B * kvh, keys * kvh * per_key / kAttentionMinWorkPerThread});
  std::vector<int64_t> cut(static_cast<size_t>(parts) + 1, B * kvh);
  cut[0] = 0;
  int64_t done = 0, part = 1;
  for (int64_t b = 0; b < B && part < parts; ++b) {
    for (int64_t g = 0; g < kvh && part < parts; ++g) {
      done += keys_of[static_cast<size_t>(b)];
      if (done * parts >= part * keys * kvh) cut[static_cast<size_t>(part++)] = b * kvh + g + 1;
    }
  }
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) run(a, cut[static_cast<size_t>(p)], cut[static_cast<size_t>(p) + 1]);
  });
  return out;
}

}  // namespace swarm
