// The serving engine: one scheduling thread owns a DecoderModel and its paged KV cache and
// runs continuous batching over every request the HTTP side submits (docs/design.md).
//
// Every step the loop
//   1. takes new requests (each choice of an `n` > 1 request is its own sequence),
//   2. drops requests whose observer reports cancelled() (client gone, episode aborted) and
//      frees their KV blocks,
//   3. packs one forward step under a token budget (max_step_tokens): every decoding sequence
//      contributes its one new token, then prefilling sequences contribute chunks of their
//      prompt from what is left of the budget, so a long prompt never stalls the others,
//   4. admits waiting sequences while the batch, the budget and the KV cache allow (a request
//      that does not fit waits; when a decoding sequence cannot grow, the most recently
//      admitted one is preempted: its blocks are freed and it is recomputed later from its
//      tokens so far — nothing sampled is lost or changed). With prefix caching a new sequence
//      starts from the cached full blocks its tokens begin with and prefills only the rest; one
//      whose next block another sequence is computing now waits a step for it instead of
//      computing it too (a GRPO group prefills its prompt once),
//   5. publishes the blocks the step filled to the prefix cache (prompt and generated tokens),
//   6. samples the sequences whose prompt is complete, applies stop ids / stop strings /
//      max_tokens, streams UTF-8-safe text deltas, and completes finished requests.
//
// Prefix caching (docs/concepts.md "Prefix caching"): blocks are keyed by a hash chain over
// their tokens rooted in the weights version, so a block is reused only by requests served by
// the weights that computed it; when the version changes the cache empties.
//
// The header is free of torch so the backend that owns it can be compiled without torch
// headers; the implementation is serving_engine_torch.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "inference/generation.hpp"

namespace swarm {

class DecoderModel;
class Tokenizer;
namespace grammar {
class TokenTrie;
}

/// The tokenizer's vocabulary as a byte trie for constrained decoding: every id's bytes, special
/// tokens matched only as tokens, unused ids never allowed.
std::shared_ptr<const grammar::TokenTrie> vocabulary_trie(const Tokenizer& tokenizer);

struct ServingConfig {
  int64_t kv_cache_tokens = 4096;        // KV capacity (rounded up to whole blocks)
  int64_t block_size = 16;               // tokens per KV block
  int64_t max_batch_sequences = 64;      // sequences in one forward step
  int64_t max_step_tokens = 512;         // tokens in one forward step
  int64_t max_waiting_sequences = 4096;  // beyond this, submit fails with UNAVAILABLE
  int64_t max_context = 0;               // prompt + completion limit; 0 = max_position_embeddings
  bool prefix_caching = true;            // share full KV blocks between sequences with equal prefixes
  std::vector<TokenId> eos_token_ids;    // always end a sequence (besides per-request stop ids)
};

/// Counters for /metrics and benchmarks (cumulative unless noted).
struct ServingStats {
  int64_t running = 0;  // now: sequences admitted (holding KV blocks)
  int64_t waiting = 0;  // now: sequences queued for admission
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;    // now: free, or cached and held by no sequence (reclaimable)
  int64_t kv_blocks_cached = 0;  // now: blocks holding reusable content (held or not)
  // Prefix cache: prompt tokens looked up at each sequence's first admission, and those found
  // cached (not prefilled).
  int64_t prefix_cache_queries_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t steps = 0;
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  int64_t preemptions = 0;
  int64_t cancelled_requests = 0;
  int64_t completed_requests = 0;
  int64_t failed_requests = 0;
  double busy_seconds = 0.0;  // time spent in forward + sampling
  // Over the most recent requests / steps (a bounded window, kLatencyWindow samples each):
  // queue wait = submit to admission; ttft = submit to the first sampled token (the engine's
  // share of a client's time to first token); step = one packed forward + sampling.
  int64_t latency_samples = 0;  // requests in the window
  double queue_wait_p50_seconds = 0.0, queue_wait_p99_seconds = 0.0;
  double ttft_p50_seconds = 0.0, ttft_p99_seconds = 0.0;
  double step_p50_seconds = 0.0, step_p99_seconds = 0.0;
  static constexpr size_t kLatencyWindow = 256;
};

/// Thread-safe: submit / set_policy_version / stats / run_exclusive from any thread.
/// Observers are called on the scheduling thread (on_text, then on_complete or on_error).
class ServingEngine {
 public:
  /// Allocates the KV cache (memory known up front) and starts the scheduling thread.
  ServingEngine(std::shared_ptr<DecoderModel> model, std::shared_ptr<const Tokenizer> tokenizer,
                ServingConfig config);
  /// Fails whatever is still pending (UNAVAILABLE) and joins the thread.
  ~ServingEngine();
  ServingEngine(const ServingEngine&) = delete;
  ServingEngine& operator=(const ServingEngine&) = delete;

  /// Queues a request. Bad requests (empty prompt, ids outside the vocabulary, prompt longer
  /// than the context or the whole KV cache) and a full queue are reported through
  /// observer->on_error before this returns; never throws.
  void submit(GenerationRequest request, std::shared_ptr<GenerationObserver> observer);

  /// The version stamped on results completed from now on.
  void set_policy_version(int64_t version);
  int64_t policy_version() const;

  /// Runs `fn` on the scheduling thread between two steps (no forward pass in flight; the
  /// KV cache and sequences stay as they are) and waits for it; rethrows what `fn` throws.
  /// For weight sync: the model's parameters may be written inside `fn`.
  void run_exclusive(std::function<void()> fn);

  /// Only inside a function run_exclusive runs (a weight swap): every running sequence gives
  /// back its KV blocks and is prefilled again from its tokens so far before it samples again,
  /// so what it samples next attends only to keys and values of the weights now loaded (job
  /// key kv_cache_on_swap: recompute). Counted as preemptions.
  void recompute_running();

  /// Stops generating for the trainer's step: nothing is scheduled until resume_generation()
  /// (requests submitted meanwhile wait; run_exclusive still runs). With `free_kv_cache` (job
  /// key free_kv_cache_during_training) the KV cache's memory is freed too: running sequences
  /// give back their blocks and are prefilled again after the resume (counted as preemptions).
  /// Returns the bytes freed (0 without free_kv_cache or when paused already).
  int64_t pause_generation(bool free_kv_cache);
  /// Allocates the KV cache again if it was freed (zeroed, the same size) and resumes.
  void resume_generation();

  /// Fails every pending and running request with UNAVAILABLE(`reason`), frees the cache and
  /// refuses new submissions. Idempotent; the destructor calls it.
  void shutdown(const std::string& reason);

  ServingStats stats() const;
  const ServingConfig& config() const;
  /// Bytes of the KV cache pool (0 while released).
  int64_t kv_cache_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace swarm
