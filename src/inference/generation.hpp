// What a generation request and its result are: the vocabulary the engine's backends, the
// serving engine and the HTTP layer share. Free of torch and of the engine, so that the
// serving engine (below the engine in the dependency order) can use it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "common/token_id.hpp"

namespace swarm {
namespace grammar {
class Grammar;
}

/// Temperatures below this sample greedily (as vLLM does): logits / T would overflow fp32 (a
/// temperature of 1e-50 rounds to 0 in fp32), and the distribution is its argmax long before.
inline constexpr double kGreedyTemperatureBelow = 1e-5;

/// Whether `temperature` samples greedily (0, or below kGreedyTemperatureBelow).
inline bool is_greedy_temperature(double temperature) { return temperature < kGreedyTemperatureBelow; }

/// The temperature a call's recorded log-probs are taken at, which the trainer recomputes them
/// under (docs/concepts.md "Temperature"): its own, or 1 for a greedy call (sampler_torch.hpp).
inline double logprob_temperature(double temperature) {
  return is_greedy_temperature(temperature) ? 1.0 : temperature;
}

/// Per-request sampling settings (OpenAI parameters after validation).
struct SamplingParams {
  double temperature = 1.0;  // is_greedy_temperature: greedy
  double top_p = 1.0;
  int64_t top_k = -1;  // -1 = off
  int64_t max_tokens = 256;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  // stop strings (not included in the output)
  std::vector<TokenId> stop_token_ids;
  int64_t n = 1;
  bool logprobs = false;
  int64_t top_logprobs = 0;  // alternatives per position when logprobs
};

struct GenerationRequest {
  std::vector<TokenId> prompt_ids;
  SamplingParams params;
  /// Constrained decoding (response_format, tool_choice required / named): every completion is
  /// a sentence of this grammar followed by an end-of-sequence token (src/grammar/). Requests
  /// with the same schema share one Grammar object (the route caches them).
  std::shared_ptr<const grammar::Grammar> grammar{};
  /// What keeps requests on one rank of a multi-rank job (its KV cache is there): the episode.
  /// Empty: none. Not sent to the rank that serves it.
  std::string affinity{};
};

/// One alternative token at a position (top_logprobs).
struct TokenAlternative {
  TokenId id = 0;
  float logprob = 0.f;
};

/// One sampled sequence.
struct GenerationChoice {
  std::vector<TokenId> ids;                        // includes a generated stop token (e.g. <|im_end|>)
  std::vector<float> logprobs;                     // log-prob of each sampled id
  std::vector<int64_t> versions;                   // the weights version that sampled each id (a generation
                                                   // running across a weight swap holds two)
  std::vector<std::vector<TokenAlternative>> top;  // per position, when requested
  std::string text;                                // decoded text without stop token / stop string
  std::string finish_reason;                       // "stop" or "length"
};

struct GenerationResult {
  std::vector<GenerationChoice> choices;
  int64_t policy_version = 0;  // the oldest weights version that sampled a token of it (the
                               // serving version when nothing was sampled)
};

/// Receives the progress of one generation. Called from the backend's thread (the mock
/// calls it inline). Implementations must be thread-safe against the HTTP side.
class GenerationObserver {
 public:
  virtual ~GenerationObserver() = default;
  /// Text that became printable for `choice` (UTF-8 safe), for streaming.
  virtual void on_text(int64_t choice, const std::string& text_delta) { (void)choice, (void)text_delta; }
  /// Exactly one of on_complete / on_error is called, once.
  virtual void on_complete(GenerationResult result) = 0;
  virtual void on_error(ErrorKind kind, const std::string& message) = 0;
  /// Polled by the backend: true when the client went away (frees the KV cache early).
  virtual bool cancelled() const { return false; }
};

}  // namespace swarm
