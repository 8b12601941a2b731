// Token sampling: see sampler_torch.hpp for the rules. The [B, V] reductions (temperature
// scaling, maximum, argmax, normaliser) run once for the whole batch: fused per row on the CPU,
// as log_softmax on another device. The per-row truncation and the inverse-CDF draw run on the
// CPU over the row's log-probabilities, sorting only as much of the row as the draw needs.
#include "inference/sampler_torch.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include <c10/core/InferenceMode.h>

#include "common/error.hpp"
#include "inference/generation.hpp"
#include "kernels/cpu/serving_ops_torch.hpp"

namespace swarm {

namespace {

// The (id, logprob) of the `count` most probable finite tokens of `row`, descending.
std::vector<std::pair<int32_t, float>> top_of(const float* row, const std::vector<int32_t>& finite,
                                              int64_t count) {
  std::vector<std::pair<int32_t, float>> out;
  const int64_t t = std::min<int64_t>(count, static_cast<int64_t>(finite.size()));
  if (t <= 0) return out;
  std::vector<int32_t> ids(static_cast<size_t>(t));
  std::partial_sort_copy(finite.begin(), finite.end(), ids.begin(), ids.end(), [row](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  out.reserve(ids.size());
  for (int32_t id : ids) out.emplace_back(id, row[id]);
  return out;
}

// Nothing truncated: the inverse CDF over the probabilities in id order, so no sorting (a
// nearly flat distribution would otherwise sort most of a large vocabulary for every token).
// Masked tokens have probability 0 and can never be chosen.
int32_t draw_untruncated(const float* probs, int64_t V, SamplerRng& rng) {
  const double u = rng.uniform();
  double part[4] = {0, 0, 0, 0};  // four chains: a serial sum would wait on every add
  int64_t i = 0;
  for (; i + 4 <= V; i += 4)
    for (int k = 0; k < 4; ++k) part[k] += probs[i + k];
  for (; i < V; ++i) part[0] += probs[i];
  const double target = u * ((part[0] + part[1]) + (part[2] + part[3]));
  // No branch on masked tokens (constrained rows zero tokens in irregular patterns): a zero
  // leaves the running sum as it is, so the first index past the target has probability > 0.
  double c = 0.0;
  for (i = 0; i < V; ++i) {
    c += probs[i];
    if (c > target) return static_cast<int32_t>(i);
  }
  for (i = V; i-- > 0;)  // rounding at the very top: the last token that can be drawn
    if (probs[i] > 0.f) return static_cast<int32_t>(i);
  return 0;
}

// Non-greedy draw over one row of scaled log-probabilities; `finite` = ids with finite logprob.
int32_t draw_row(const float* row, const std::vector<int32_t>& finite, const SamplingConfig& cfg,
                 SamplerRng& rng) {
  const auto cmp = [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
  // One draw per sampled row, whatever the truncation turns out to be.
  const double u = rng.uniform();

  std::vector<int32_t> idx = finite;

  int64_t n = static_cast<int64_t>(idx.size());
  if (cfg.top_k > 0 && cfg.top_k < n) {
    std::nth_element(idx.begin(), idx.begin() + cfg.top_k, idx.end(), cmp);
    idx.resize(static_cast<size_t>(cfg.top_k));
    n = cfg.top_k;
  }
  double total = 0.0;  // mass left after top-k (before renormalisation)
  for (int32_t id : idx) total += std::exp(static_cast<double>(row[id]));

  // Sorted prefix of idx (descending) and its cumulative masses, grown on demand.
  std::vector<double> cum;
  cum.reserve(static_cast<size_t>(std::min<int64_t>(n, 256)));
  int64_t sorted = 0;
  const auto ensure = [&](int64_t want) {  // makes idx[0, want) sorted, cum filled for it
    want = std::min(want, n);
    if (want <= sorted) return;
    int64_t grow = std::max<int64_t>(want, std::min<int64_t>(n, std::max<int64_t>(64, sorted * 8)));
    std::partial_sort(idx.begin() + sorted, idx.begin() + grow, idx.end(), cmp);
    double c = cum.empty() ? 0.0 : cum.back();
    for (int64_t j = sorted; j < grow; ++j) {
      c += std::exp(static_cast<double>(row[idx[static_cast<size_t>(j)]]));
      cum.push_back(c);
    }
    sorted = grow;
  };

  // Nucleus: smallest prefix whose cumulative (renormalised) probability reaches top_p.
  int64_t kept = n;
  double kept_mass = total;
  if (cfg.top_p < 1.0) {
    const double threshold = cfg.top_p * total;
    int64_t j = 0;
    kept = 0;
    while (kept == 0) {
      ensure(j + 1);
      for (; j < sorted; ++j) {
        if (cum[static_cast<size_t>(j)] >= threshold) {
          kept = j + 1;
          break;
        }
      }
      if (kept == 0 && sorted == n) kept = n;  // rounding: keep everything
    }
    kept_mass = cum[static_cast<size_t>(kept - 1)];
  }

  // Inverse CDF over the kept tokens, descending.
  const double target = u * kept_mass;
  int64_t j = 0;
  for (;;) {
    ensure(j + 1);
    const int64_t end = std::min(sorted, kept);
    for (; j < end; ++j)
      if (cum[static_cast<size_t>(j)] > target) return idx[static_cast<size_t>(j)];
    if (end == kept) return idx[static_cast<size_t>(kept - 1)];  // rounding at the very top
  }
}

}  // namespace

SamplerRng::SamplerRng(uint64_t seed) : gen_(seed) {}

SamplerRng SamplerRng::from_random_seed() {
  std::random_device rd;
  const uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ static_cast<uint64_t>(rd());
  return SamplerRng(seed);
}

uint64_t SamplerRng::next_u64() { return gen_.next(); }

double SamplerRng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

std::vector<SampledToken> sample_tokens(const at::Tensor& logits, const std::vector<SamplingConfig>& configs,
                                        std::vector<SamplerRng*>& rngs) {
  SWARM_REQUIRE(logits.defined() && logits.dim() == 2, ErrorKind::INVALID_ARGUMENT,
                "sample_tokens: logits must be a 2-D [B, V] tensor");
  SWARM_REQUIRE(logits.is_floating_point(), ErrorKind::INVALID_ARGUMENT,
                "sample_tokens: logits must be floating point");
  const int64_t B = logits.size(0);
  const int64_t V = logits.size(1);
  SWARM_REQUIRE(static_cast<int64_t>(configs.size()) == B && static_cast<int64_t>(rngs.size()) == B,
                ErrorKind::INVALID_ARGUMENT,
                "sample_tokens: " + std::to_string(B) + " rows but " + std::to_string(configs.size()) +
                    " configs and " + std::to_string(rngs.size()) + " rngs");
  std::vector<SampledToken> out(static_cast<size_t>(B));
  if (B == 0) return out;
  SWARM_REQUIRE(V > 0 && V <= std::numeric_limits<int32_t>::max(), ErrorKind::INVALID_ARGUMENT,
                "sample_tokens: bad vocabulary size " + std::to_string(V));

  // Where each row's log-probabilities come from. On the CPU: one fused pass per row for its
  // maximum, argmax and normaliser (serving_ops_torch.hpp), and the whole row only for rows that
  // are drawn from or report top_logprobs. Elsewhere: log_softmax over the batch, copied back.
  std::vector<float> temps(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const double t = configs[static_cast<size_t>(b)].temperature;
    temps[static_cast<size_t>(b)] = static_cast<float>(logprob_temperature(t));  // greedy: T = 1
  }
  at::Tensor x, logp_all, argmax_all, probs_all;
  std::vector<SoftmaxRowStats> stats;
  {
    c10::InferenceMode guard;
    x = logits.to(at::kFloat).contiguous();  // never modified in place
    if (x.device().is_cpu()) {
      stats = softmax_row_stats(x, temps);
    } else {
      const at::Tensor t =
          at::tensor(temps, at::TensorOptions().dtype(at::kFloat)).to(x.device()).view({B, 1});
      logp_all = at::log_softmax(x / t, 1).to(at::kCPU).contiguous();
      argmax_all = at::argmax(x, 1).to(at::kCPU, at::kLong).contiguous();
      probs_all = logp_all.exp();  // vectorised once for the untruncated draws
    }
  }
  const bool on_cpu = !stats.empty();
  std::vector<float> row_buf, prob_buf;  // one row's log-probabilities / probabilities (CPU)

  std::vector<int32_t> finite;
  finite.reserve(static_cast<size_t>(V));
  for (int64_t b = 0; b < B; ++b) {
    const SamplingConfig& cfg = configs[static_cast<size_t>(b)];
    SampledToken& tok = out[static_cast<size_t>(b)];
    const bool truncates = cfg.top_k > 0 || cfg.top_p < 1.0;
    const bool draws = !is_greedy_temperature(cfg.temperature);
    const float* row = nullptr;
    const float* probs = nullptr;
    int64_t argmax = 0;
    if (on_cpu) {
      const SoftmaxRowStats& st = stats[static_cast<size_t>(b)];
      SWARM_REQUIRE(!st.has_nan && std::isfinite(st.max), ErrorKind::INVALID_ARGUMENT,
                    "sample_tokens: row " + std::to_string(b) + " has no finite logit");
      argmax = st.argmax;
      if (!draws && cfg.top_logprobs <= 0) {  // greedy: nothing else of the row is needed
        tok.id = static_cast<int32_t>(argmax);
        tok.logprob = (x.data_ptr<float>()[b * V + argmax] - st.max) - st.log_sum;  // as log_softmax rounds
        continue;
      }
      row_buf.resize(static_cast<size_t>(V));
      if (draws && !truncates) prob_buf.resize(static_cast<size_t>(V));
      log_softmax_row(x.data_ptr<float>() + b * V, V, temps[static_cast<size_t>(b)], st, row_buf.data(),
                      draws && !truncates ? prob_buf.data() : nullptr);
      row = row_buf.data();
      if (draws && !truncates) probs = prob_buf.data();
    } else {
      row = logp_all.data_ptr<float>() + b * V;
      probs = probs_all.data_ptr<float>() + b * V;
      argmax = argmax_all.data_ptr<int64_t>()[b];
      // The argmax is finite unless the whole row is masked (or NaN).
      SWARM_REQUIRE(std::isfinite(row[argmax]), ErrorKind::INVALID_ARGUMENT,
                    "sample_tokens: row " + std::to_string(b) + " has no finite logit");
    }
    const bool need_finite = cfg.top_logprobs > 0 || (draws && truncates);
    finite.clear();
    if (need_finite)
      for (int32_t i = 0; i < static_cast<int32_t>(V); ++i)
        if (row[i] > -std::numeric_limits<float>::infinity()) finite.push_back(i);

    if (!draws) {
      tok.id = static_cast<int32_t>(argmax);
    } else {
      SamplerRng* rng = rngs[static_cast<size_t>(b)];
      SWARM_REQUIRE(rng != nullptr, ErrorKind::INVALID_ARGUMENT,
                    "sample_tokens: row " + std::to_string(b) + " has no rng");
      const bool top_k_cuts = cfg.top_k > 0 && cfg.top_k < static_cast<int64_t>(finite.size());
      if (truncates && (top_k_cuts || cfg.top_p < 1.0)) {
        tok.id = draw_row(row, finite, cfg, *rng);
      } else {
        if (probs == nullptr) {  // a top_k that cuts nothing: the probabilities after all
          prob_buf.resize(static_cast<size_t>(V));
          for (int64_t i = 0; i < V; ++i) prob_buf[static_cast<size_t>(i)] = std::exp(row[i]);
          probs = prob_buf.data();
        }
        tok.id = draw_untruncated(probs, V, *rng);
      }
    }
    tok.logprob = row[tok.id];
    tok.top = top_of(row, finite, cfg.top_logprobs);
  }
  return out;
}

}  // namespace swarm
