// Driving the libtorch engine (DecoderModel::forward_step over a paged KvCache) the way the
// serving engine does, for benchmarks: chunked prefill of several prompts, batched greedy
// decode over the same positions (timed by best_decode_pass, which bench_anchor's llama.cpp side
// uses too), and a greedy continuation of one prompt. Shared by bench_inference and bench_anchor.
// Header-only; not thread-safe.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "inference/decoder_model_torch.hpp"
#include "inference/kv_cache_torch.hpp"
#include "inference/sampler_torch.hpp"

namespace swarm::bench {

/// One decode case: `batch` sequences, `warmup` untimed steps, then `steps` timed ones, the
/// timed ones run `reps` times over the same positions and the best pass counts.
struct EngineDecodeSpec {
  int64_t batch = 1;
  int64_t warmup = 2;
  int64_t steps = 16;
  int64_t reps = 1;
};

struct EngineDecodeResult {
  double seconds = 0;    // best pass over the timed steps, forward + sample
  double forward_s = 0;  // of which forward_step
  double sample_s = 0;   // of which sample_tokens
};

inline std::vector<swarm::SamplingConfig> greedy_sampling(size_t n) {
  swarm::SamplingConfig greedy;
  greedy.temperature = 0.0;
  return std::vector<swarm::SamplingConfig>(n, greedy);
}

inline std::vector<std::vector<int32_t>> random_token_prompts(int64_t batch, int64_t tokens, int64_t vocab,
                                                              std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(tokens));
    for (auto& t : p) t = dist(rng);
  }
  return prompts;
}

/// Finite, non-trivial K/V in every block of `cache` (the "prompt already in the cache" of a
/// decode case): one random block broadcast over the pool.
inline void fill_cache_pattern(swarm::KvCache& cache, const swarm::ModelConfig& config,
                               c10::ScalarType type) {
  c10::InferenceMode guard;
  at::Tensor pattern =
      at::randn({1, cache.block_size(), config.num_key_value_heads, config.head_dim}).to(type);
  for (int64_t l = 0; l < cache.num_layers(); ++l) {
    cache.keys(l).copy_(pattern);
    cache.values(l).copy_(pattern * 0.5);
  }
}

/// The timing of a decode case, whatever runs it: spec.warmup untimed steps from `prompt`, then
/// spec.reps passes of spec.steps timed steps over the same positions; the best pass counts.
/// step(pos, forward_s, sample_s) runs one step at position pos, adding its forward and sampling
/// seconds; before_pass(pos) prepares a pass that starts at pos (e.g. drops the last pass's cells).
template <class Step, class BeforePass>
EngineDecodeResult best_decode_pass(const EngineDecodeSpec& spec, int64_t prompt, const Step& step,
                                    const BeforePass& before_pass) {
  using Clock = std::chrono::steady_clock;
  double unused_f = 0, unused_s = 0;
  for (int64_t i = 0; i < spec.warmup; ++i) step(prompt + i, unused_f, unused_s);
  EngineDecodeResult r;
  r.seconds = 1e30;
  for (int64_t rep = 0; rep < std::max<int64_t>(1, spec.reps); ++rep) {
    const int64_t first = prompt + spec.warmup;  // the same positions (and so the same work) every pass
    before_pass(first);
    double forward_s = 0, sample_s = 0;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < spec.steps; ++i) step(first + i, forward_s, sample_s);
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (seconds < r.seconds) {
      r.seconds = seconds;
      r.forward_s = forward_s;
      r.sample_s = sample_s;
    }
  }
  return r;
}

/// Prefills `prompts` (slots first_slot..) in forward_step calls of at most `chunk` tokens,
/// packing several prompts into one call and splitting a prompt across calls where needed, and
/// samples the first token of each prompt greedily as it completes. Returns the number of calls.
inline int64_t engine_prefill(const swarm::DecoderModel& model, swarm::KvCache& cache,
                              const std::vector<std::vector<int32_t>>& prompts, int64_t first_slot,
                              int64_t chunk) {
  std::vector<int64_t> done(prompts.size(), 0);
  size_t next = 0;  // the first prompt not fully prefilled
  int64_t calls = 0;
  swarm::SamplerRng rng(1);
  while (next < prompts.size()) {
    std::vector<swarm::StepInput> step;
    std::vector<size_t> owner;
    int64_t budget = chunk;
    for (size_t p = next; p < prompts.size() && budget > 0; ++p) {
      const int64_t left = static_cast<int64_t>(prompts[p].size()) - done[p];
      const int64_t take = std::min(budget, left);
      swarm::StepInput in;
      in.seq_slot = first_slot + static_cast<int64_t>(p);
      in.start_pos = done[p];
      in.tokens.assign(prompts[p].begin() + done[p], prompts[p].begin() + done[p] + take);
      if (!cache.ensure_capacity(in.seq_slot, in.start_pos + take))
        throw std::runtime_error("KV pool too small for prefill");
      step.push_back(std::move(in));
      owner.push_back(p);
      budget -= take;
    }
    at::Tensor logits = model.forward_step(step, cache);
    ++calls;
    std::vector<int64_t> finished;
    for (size_t i = 0; i < step.size(); ++i) {
      done[owner[i]] += static_cast<int64_t>(step[i].tokens.size());
      if (done[owner[i]] == static_cast<int64_t>(prompts[owner[i]].size()))
        finished.push_back(static_cast<int64_t>(i));
    }
    if (!finished.empty()) {
      at::Tensor rows = logits.index_select(0, at::tensor(finished, at::kLong));
      std::vector<swarm::SamplerRng*> rngs(finished.size(), &rng);
      swarm::sample_tokens(rows, greedy_sampling(finished.size()), rngs);
    }
    while (next < prompts.size() && done[next] == static_cast<int64_t>(prompts[next].size())) ++next;
  }
  return calls;
}

/// `spec.batch` sequences (slots 0..batch-1), each with `prompt` tokens already cached,
/// decoded greedily one token per sequence per forward_step. Releases the slots at the end.
inline EngineDecodeResult engine_decode(const swarm::DecoderModel& model, swarm::KvCache& cache,
                                        const EngineDecodeSpec& spec, int64_t prompt, std::mt19937& gen) {
  using Clock = std::chrono::steady_clock;
  const size_t B = static_cast<size_t>(spec.batch);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(model.config().vocab_size - 1));
  std::vector<int32_t> tokens(B);
  for (auto& t : tokens) t = dist(gen);
  for (size_t b = 0; b < B; ++b) {
    if (!cache.ensure_capacity(static_cast<int64_t>(b), prompt + spec.warmup + spec.steps))
      throw std::runtime_error("KV pool too small for decode batch " + std::to_string(B));
  }
  const auto configs = greedy_sampling(B);
  std::vector<swarm::SamplerRng> rng_store;
  for (size_t b = 0; b < B; ++b) rng_store.emplace_back(b);
  std::vector<swarm::SamplerRng*> rngs;
  for (auto& r : rng_store) rngs.push_back(&r);

  auto step = [&](int64_t pos, double& forward_s, double& sample_s) {
    std::vector<swarm::StepInput> inputs(B);
    for (size_t b = 0; b < B; ++b) {
      inputs[b].seq_slot = static_cast<int64_t>(b);
      inputs[b].tokens = {tokens[b]};
      inputs[b].start_pos = pos;
    }
    auto t0 = Clock::now();
    at::Tensor logits = model.forward_step(inputs, cache);
    auto t1 = Clock::now();
    std::vector<swarm::SampledToken> sampled = swarm::sample_tokens(logits, configs, rngs);
    for (size_t b = 0; b < B; ++b) tokens[b] = sampled[b].id;
    forward_s += std::chrono::duration<double>(t1 - t0).count();
    sample_s += std::chrono::duration<double>(Clock::now() - t1).count();
  };
  const EngineDecodeResult r = best_decode_pass(spec, prompt, step, [](int64_t) {});
  for (size_t b = 0; b < B; ++b) cache.release(static_cast<int64_t>(b));
  return r;
}

/// Greedy continuation of `prompt` by `new_tokens` tokens in slot `slot` (argmax of the
/// logits, ties to the lowest id); the slot is released afterwards.
inline std::vector<int32_t> engine_greedy_ids(const swarm::DecoderModel& model, swarm::KvCache& cache,
                                              const std::vector<int32_t>& prompt, int64_t new_tokens,
                                              int64_t slot = 0) {
  std::vector<int32_t> out;
  swarm::StepInput in;
  in.seq_slot = slot;
  in.tokens = prompt;
  in.start_pos = 0;
  const int64_t total = static_cast<int64_t>(prompt.size()) + new_tokens;
  if (!cache.ensure_capacity(slot, total)) throw std::runtime_error("KV pool too small for the greedy check");
  for (int64_t i = 0; i < new_tokens; ++i) {
    at::Tensor logits = model.forward_step({in}, cache);
    const int32_t id = static_cast<int32_t>(logits[0].to(at::kFloat).argmax().item<int64_t>());
    out.push_back(id);
    in.start_pos += static_cast<int64_t>(in.tokens.size());
    in.tokens = {id};
  }
  cache.release(slot);
  return out;
}

}  // namespace swarm::bench
