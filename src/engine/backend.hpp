// The inference + training backend behind the engine: `mock` (no torch) or `torch`.
// Both are driven through the same engine, pool, HTTP layer and client.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/error.hpp"
#include "inference/generation.hpp"
#include "rollout_pool/types.hpp"

namespace swarm {

struct Job;

/// What a policy update did, computed from the real batch.
/// One log_metrics name over the train episodes of a step that sent it.
struct LogMetricStats {
  double mean = 0.0;
  double min = 0.0;
  double max = 0.0;
  int64_t episodes = 0;  // how many sent it
};
/// At most this many log_metrics names are aggregated per step (the first in name order).
constexpr size_t kMaxStepLogMetrics = 256;

struct TrainStepReport {
  int64_t global_step = 0;  // step number after this update
  int64_t episodes = 0;
  int64_t samples = 0;
  int64_t tokens = 0;          // all tokens in the batch
  int64_t trained_tokens = 0;  // loss-mask-1 tokens
  int64_t tasks = 0;
  double reward_mean = 0.0;
  double reward_std = 0.0;
  double reward_min = 0.0;
  double reward_max = 0.0;
  double seconds = 0.0;
  std::map<std::string, double> metrics;              // backend-specific (loss, kl, ...)
  std::map<std::string, LogMetricStats> log_metrics;  // what the agents sent (workflow_output.log_metrics)
};

/// What one rank holds in memory, in bytes (the engine status's `memory`).
struct RankMemory {
  int rank = 0;
  std::string device;                 // "cpu", "cuda:0", ...
  int64_t weights_bytes = 0;          // the trainer's compute-dtype weights (policy, critic, KL reference)
  int64_t serving_weights_bytes = 0;  // the copy the serving engine generates with
  int64_t gradients_bytes = 0;        // the fp32 gradient buffers
  int64_t optimizer_bytes = 0;        // AdamW moments of this rank's shard
  int64_t master_weights_bytes = 0;   // fp32 master shard (0 where the weights are the masters)
  int64_t kv_cache_bytes = 0;         // the serving engine's paged KV cache (0 where none)
  int64_t peak_bytes = 0;             // the device's peak: CUDA caching allocator, or the process's peak RSS
  int64_t activations_peak_bytes =
      -1;  // the last training step's peak above what it started with; -1 = none yet
};
/// [{rank, device, weights_bytes, ...}] as the status routes carry it.
nlohmann::json rank_memory_json(const std::vector<RankMemory>& ranks);
/// One entry of rank_memory_json (a follower's reply). INVALID_ARGUMENT when it is not one.
RankMemory rank_memory_from_json(const nlohmann::json& j);

/// What one rank served (the engine status's `serving`, /metrics' swarm_rank_* series): every
/// rank of a multi-rank job serves, and rank 0 routes each generation to one (rank_router.hpp).
struct RankServing {
  int rank = 0;
  bool up = true;                  // false once its serving link broke (it gets no more requests)
  int64_t requests = 0;            // generation requests routed to it (cumulative)
  int64_t generated_tokens = 0;    // tokens it generated for finished requests (cumulative)
  int64_t in_flight = 0;           // requests it serves now
  int64_t outstanding_tokens = 0;  // now: prompt + max_tokens × n of what it serves
};
/// [{rank, up, requests, generated_tokens, in_flight, outstanding_tokens}].
nlohmann::json rank_serving_json(const std::vector<RankServing>& ranks);

/// Fills the batch-derived fields of a report (counts, reward stats, log_metrics).
TrainStepReport summarize_batch(const TrainBatch& batch);
/// {name: {"mean", "min", "max", "episodes"}} (non-finite values as null).
nlohmann::json log_metrics_json(const std::map<std::string, LogMetricStats>& stats);

/// The pluggable backend. Thread-safety: boot/train_step/release are called from the
/// engine's control thread only; tokenizer methods and generate() from any thread once
/// booted. Default methods fail loudly ("backend X does not support Y").
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  /// Loads model, tokenizer, optimizer; allocates caches. Blocking; throws on failure;
  /// returns early (throwing) if `stop` is requested.
  virtual void boot(const Job& job, std::stop_token stop) = 0;

  /// The served model's id for /v1/models.
  virtual std::string model_id() const = 0;
  /// Maximum prompt + completion length in tokens.
  virtual int64_t max_context_length() const = 0;

  /// Renders an OpenAI chat request's messages (and tools) with the chat template to
  /// prompt token ids. Throws INVALID_ARGUMENT for malformed messages. Ordered JSON keeps the
  /// request's key order, so `tojson` in a template prints what the agent sent.
  virtual std::vector<TokenId> render_chat(const nlohmann::ordered_json& messages,
                                           const nlohmann::ordered_json& tools,
                                           bool add_generation_prompt) const;
  /// render_chat with extra template variables (a request's `chat_template_kwargs`, e.g.
  /// {"enable_thinking": false}). The default ignores them (the mock's template has none).
  virtual std::vector<TokenId> render_chat_with_kwargs(const nlohmann::ordered_json& messages,
                                                       const nlohmann::ordered_json& tools,
                                                       bool add_generation_prompt,
                                                       const nlohmann::ordered_json& template_kwargs) const {
    (void)template_kwargs;
    return render_chat(messages, tools, add_generation_prompt);
  }
  /// The text the chat template renders (what render_chat_with_kwargs tokenizes), for splicing
  /// a conversation's generated ids with what the environment added; nullopt when the backend
  /// has no text form (then conversations are always rendered afresh).
  virtual std::optional<std::string> render_chat_text(const nlohmann::ordered_json& messages,
                                                      const nlohmann::ordered_json& tools,
                                                      bool add_generation_prompt,
                                                      const nlohmann::ordered_json& template_kwargs) const {
    (void)messages, (void)tools, (void)add_generation_prompt, (void)template_kwargs;
    return std::nullopt;
  }
  /// Tokenizes text a chat template rendered: special tokens written in it become their ids,
  /// no BOS is added (as render_chat does).
  virtual std::vector<TokenId> encode_rendered(const std::string& text) const;
  /// The chat template's source text ("" when there is none): tool-call and reasoning
  /// formats are detected from it (tool_call_parser / reasoning_parser `auto`).
  virtual std::string chat_template_source() const { return ""; }
  /// A plain-text prompt → ids, as the model's tokenizer encodes a prompt (the torch engine
  /// adds BOS when the tokenizer config says so; the mock adds nothing).
  virtual std::vector<TokenId> encode(const std::string& text) const;
  /// Ids → text (special tokens skipped).
  virtual std::string decode(const std::vector<TokenId>& ids) const;
  /// The text of one token for logprobs output (may be a partial UTF-8 sequence's bytes).
  virtual std::string token_text(TokenId id) const;

  /// Starts generating; the observer is told of progress and the result. May call the
  /// observer before returning. Never throws: errors go to observer->on_error.
  virtual void generate(GenerationRequest request, std::shared_ptr<GenerationObserver> observer);

  /// One policy update on the batch (blocking; control thread).
  virtual TrainStepReport train_step(const TrainBatch& batch, int64_t next_global_step, std::stop_token stop);
  /// Makes the inference side serve weights `version` (after train_step; in-process sync).
  virtual void set_policy_version(int64_t version) = 0;

  /// Live figures of the inference engine for /metrics (name → value; e.g. running
  /// sequences, free KV blocks, generated tokens). Thread-safe; empty by default.
  virtual std::map<std::string, double> inference_metrics() const { return {}; }

  /// What each rank holds, measured at boot and after each policy step (rank order). Thread-safe;
  /// empty where the backend has no model memory to speak of (the mock).
  virtual std::vector<RankMemory> memory() const { return {}; }
  /// What each rank served (rank order). Thread-safe; empty where generation is not spread
  /// over ranks by a router (the mock).
  virtual std::vector<RankServing> rank_serving() const { return {}; }

  /// Releases the model and memory (stop_engine). The object is destroyed afterwards.
  virtual void release() {}

  /// Writes what resuming needs into the fresh directory `dir` (control thread, between steps):
  /// the torch backend writes a Hugging Face model directory (config.json, safetensors,
  /// tokenizer files) plus trainer_state/ (optimizer). Throws when the weights are not in a
  /// consistent state (e.g. a policy step was interrupted).
  virtual void save_checkpoint(const std::filesystem::path& dir);
  /// Makes the next boot() load the weights and trainer state from `checkpoint` (a directory
  /// save_checkpoint wrote) instead of job.model. Called before boot.
  void set_resume_checkpoint(std::filesystem::path checkpoint) { resume_checkpoint_ = std::move(checkpoint); }

  /// Told around each weight swap inside train_step (the moment generation pauses and the
  /// serving weights change): true before, false after, on whichever thread swaps. The engine
  /// sets it before boot (asynchronous training shows the swap as ENGINE.WEIGHT_SYNCING).
  using SwapListener = std::function<void(bool swapping)>;
  void set_swap_listener(SwapListener listener) { swap_listener_ = std::move(listener); }

 protected:
  void notify_swap(bool swapping) const {
    if (swap_listener_) swap_listener_(swapping);
  }
  SwapListener swap_listener_;
  [[noreturn]] void unsupported(const std::string& what) const;
  std::filesystem::path resume_checkpoint_;  // empty: start from job.model
};

/// Creates a backend by name ("mock", "torch"). Throws INVALID_ARGUMENT for an unknown
/// name, and a clear error for "torch" when it was not registered (a build without libtorch).
std::unique_ptr<Backend> make_backend(const std::string& name);
/// Names make_backend accepts in this process.
std::vector<std::string> available_backends();
/// Makes `name` available to make_backend (the torch backend lives in a library the engine
/// does not link: programs that link it call register_torch_backend() at start-up).
/// Thread-safe; a later registration of the same name replaces the earlier one.
void register_backend(const std::string& name, std::function<std::unique_ptr<Backend>()> factory);

}  // namespace swarm
