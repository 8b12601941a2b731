// The mock backend: deterministic fake generation and a fake training step, no torch.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "engine/backend.hpp"

namespace swarm {

class BlockAllocator;

/// Deterministic stand-in for a model, used by CI, benchmarks and any build without
/// libtorch. Tokenizer: ids 0–255 are bytes, 256 <|endoftext|>, 257 <|im_start|>,
/// 258 <|im_end|>; chat template in the ChatML style.
///
/// Generation echoes the last user or tool message with some letters replaced by random ones;
/// the replacement rate falls with each policy version, so rewards that measure
/// faithfulness rise across weight-sync cycles (a simulated learner, nothing more).
/// Output depends only on (prompt ids, seed, choice index, policy version), so equal
/// requests give equal completions. Thread-safe after boot.
///
/// It also runs the torch engine's prefix cache (BlockAllocator) over the token ids of what it
/// serves, each choice after the one before, so /metrics shows the same prefix-cache counters
/// and block gauges without libtorch (job keys prefix_caching, kv_cache_tokens, kv_block_size).
class MockBackend : public Backend {
 public:
  static constexpr TokenId kEndOfText = 256;
  static constexpr TokenId kImStart = 257;
  static constexpr TokenId kImEnd = 258;
  static constexpr TokenId kVocabSize = 259;

  std::string name() const override { return "mock"; }
  void boot(const Job& job, std::stop_token stop) override;
  std::string model_id() const override { return model_id_; }
  int64_t max_context_length() const override { return max_context_; }

  std::vector<TokenId> render_chat(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json& tools,
                                   bool add_generation_prompt) const override;
  /// Names the mock's convention for format detection: tool calls as hermes-style
  /// `<tool_call>` blocks (reasoning_parser auto finds no `<think>`: set it to think to
  /// split a scripted reasoning block).
  std::string chat_template_source() const override {
    return "mock ChatML; tool calls: <tool_call> ... </tool_call>";
  }
  /// ChatML text with the special tokens written out (<|im_start|>, <|im_end|>).
  std::optional<std::string> render_chat_text(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                              const nlohmann::ordered_json& template_kwargs) const override;
  std::vector<TokenId> encode_rendered(const std::string& text) const override;
  std::vector<TokenId> encode(const std::string& text) const override;
  std::string decode(const std::vector<TokenId>& ids) const override;
  std::string token_text(TokenId id) const override;

  void generate(GenerationRequest request, std::shared_ptr<GenerationObserver> observer) override;
  TrainStepReport train_step(const TrainBatch& batch, int64_t next_global_step,
                             std::stop_token stop) override;
  void save_checkpoint(const std::filesystem::path& dir) override;
  void set_policy_version(int64_t version) override { policy_version_ = version; }
  /// The simulated prefix cache's counters (the torch engine's names).
  std::map<std::string, double> inference_metrics() const override;
  MockBackend();
  ~MockBackend() override;

  /// Letter replacement probability at a policy version and temperature.
  static double corruption_rate(int64_t policy_version, double temperature);

 private:
  std::string model_id_ = "mock";
  int64_t max_context_ = 32768;
  double train_seconds_ = 0.0;
  std::atomic<int64_t> policy_version_{0};

  // The simulated prefix cache (under kv_mu_): blocks, the version its content is of, counters.
  void simulate_prefix_cache(const std::vector<TokenId>& prompt, const std::vector<TokenId>& generated,
                             int64_t version);
  mutable std::mutex kv_mu_;
  std::unique_ptr<BlockAllocator> kv_;
  int64_t kv_version_ = 0;
  int64_t kv_next_slot_ = 0;
  int64_t kv_queries_ = 0;
  int64_t kv_hits_ = 0;
};

}  // namespace swarm
