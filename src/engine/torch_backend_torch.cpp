// The torch backend: loads a Hugging Face model directory, serves it through the ServingEngine
// and trains it with the GrpoTrainer; weight sync is an in-process copy between the two.
#include "engine/torch_backend.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <map>
#include <filesystem>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>

#include "inference/chat_template.hpp"
#include "inference/decoder_model_torch.hpp"
#include "inference/kv_cache_torch.hpp"
#include "inference/serving_engine.hpp"
#include "inference/tokenizer.hpp"
#include "swarm/job.hpp"
#include "trainer/checkpoint_torch.hpp"
#include "trainer/grpo_trainer_torch.hpp"

namespace swarm {
namespace {

constexpr int64_t kAutoKvCacheBytes = int64_t{4} << 30;

class TorchBackend final : public Backend {
 public:
  std::string name() const override { return "torch"; }

  void boot(const Job& job, std::stop_token stop) override {
    const auto cancelled = [&] {
      if (stop.stop_requested()) throw SwarmError(ErrorKind::CONFLICT, "boot cancelled");
    };
    // A resumed run loads the checkpoint's model directory (same files, trained weights).
    const bool resuming = !resume_checkpoint_.empty();
    const std::filesystem::path dir = resuming ? resume_checkpoint_ : std::filesystem::path(job.model);
    SWARM_REQUIRE(std::filesystem::is_directory(dir), ErrorKind::INVALID_ARGUMENT,
                  "model '" + dir.string() + "' is not a directory (the torch engine needs a Hugging Face model directory)");
    SWARM_REQUIRE(std::filesystem::is_regular_file(dir / "config.json"), ErrorKind::INVALID_ARGUMENT,
                  "model directory '" + dir.string() + "' has no config.json");
    model_dir_ = dir;
    job_ = job;
    const int threads = job.engine_threads > 0 ? static_cast<int>(job.engine_threads)
                                               : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const DType dtype = job.dtype == "bf16" ? DType::BF16 : DType::F32;
    const ThreadPlan plan = configure_compute_threads(threads, dtype);

    tokenizer_ = Tokenizer::from_directory(dir.string());
    try {
      chat_template_.emplace(ChatTemplate::from_directory(dir.string()));
    } catch (const SwarmError& e) {
      chat_template_error_ = e.what();  // completions still work; chat requests get this error
    }
    cancelled();

    const torch::Device device = torch::cuda::is_available() ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
    model_ = DecoderModel::load(dir, dtype, device);
    cancelled();
    const ModelConfig& cfg = model_->config();
    if (tokenizer_->vocab_size() > cfg.vocab_size)
      spdlog::warn("torch engine: the tokenizer has {} ids but the model only {}; ids beyond it are rejected",
                   tokenizer_->vocab_size(), cfg.vocab_size);

    max_context_ = std::min(job.max_prompt_length + job.max_response_length, cfg.max_position_embeddings);
    ServingConfig sc;
    sc.block_size = job.kv_block_size;
    sc.max_batch_sequences = job.max_batch_sequences;
    sc.max_step_tokens = job.max_step_tokens;
    sc.max_context = max_context_;
    for (int64_t id : cfg.stop_token_ids()) sc.eos_token_ids.push_back(static_cast<TokenId>(id));
    if (auto eos = tokenizer_->eos_id())
      if (std::find(sc.eos_token_ids.begin(), sc.eos_token_ids.end(), *eos) == sc.eos_token_ids.end())
        sc.eos_token_ids.push_back(*eos);
    const int64_t bytes_per_token = KvCache::bytes_per_block(cfg, 1, model_->scalar_type());
    if (job.kv_cache_tokens > 0) {
      sc.kv_cache_tokens = job.kv_cache_tokens;
    } else {
      const int64_t seqs = std::min(job.max_batch_sequences, job.effective_max_parallel_episodes());
      sc.kv_cache_tokens = std::max(max_context_, std::min(seqs * max_context_, kAutoKvCacheBytes / bytes_per_token));
    }
    {
      // bf16 computes in bf16 but keeps fp32 master weights: seed them from the checkpoint's
      // own precision, not from the rounded bf16 copy.
      std::shared_ptr<DecoderModel> master;
      if (dtype != DType::F32 && !resuming) master = DecoderModel::load(dir, DType::F32, device);
      trainer_ = std::make_unique<GrpoTrainer>(model_, TrainerOptions::from_job(job), nullptr, master.get());
      if (resuming) load_trainer_state(dir / "trainer_state", *trainer_);
    }
    cancelled();
    auto engine = std::make_shared<ServingEngine>(model_, tokenizer_, sc);
    engine->set_policy_version(0);
    {
      std::lock_guard lk(engine_mu_);
      engine_ = engine;
    }
    spdlog::info(
        "torch engine: {} ({}, {} parameters, {}) on {} with {} threads (libtorch {}, OpenBLAS {}); context {} "
        "tokens; KV cache {} tokens ({:.1f} MiB); batch {} sequences / {} tokens per step",
        job.model, cfg.architecture_name, cfg.parameter_count(), job.dtype, device.str(), threads,
        plan.torch_threads, plan.openblas_threads, max_context_,
        sc.kv_cache_tokens, static_cast<double>(engine->kv_cache_bytes()) / (1 << 20), sc.max_batch_sequences,
        sc.max_step_tokens);
  }

  std::string model_id() const override { return job_.model; }
  int64_t max_context_length() const override { return max_context_; }

  std::vector<TokenId> render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                   bool add_generation_prompt) const override {
    SWARM_REQUIRE(chat_template_.has_value(), ErrorKind::INVALID_ARGUMENT,
                  "this model has no chat template (" + chat_template_error_ + "); use /v1/completions");
    SWARM_REQUIRE(messages.is_array() && !messages.empty(), ErrorKind::INVALID_ARGUMENT,
                  "'messages' must be a non-empty array");
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto& m = messages[i];
      SWARM_REQUIRE(m.is_object() && m.contains("role") && m["role"].is_string(), ErrorKind::INVALID_ARGUMENT,
                    "messages[" + std::to_string(i) + "] must be an object with a string 'role'");
    }
    const std::string text = chat_template_->render(messages, tools, add_generation_prompt);
    // As Hugging Face's apply_chat_template(tokenize=True): the template already wrote any BOS.
    return tokenizer_->encode(text, /*add_special_tokens=*/false);
  }

  std::vector<TokenId> encode(const std::string& text) const override {
    return tokenizer_->encode(text, /*add_special_tokens=*/true);
  }
  std::string decode(const std::vector<TokenId>& ids) const override { return tokenizer_->decode(ids, true); }
  std::string token_text(TokenId id) const override {
    if (id < 0 || id >= tokenizer_->vocab_size()) return std::string();
    return tokenizer_->token_bytes(id);
  }

  void generate(GenerationRequest request, std::shared_ptr<GenerationObserver> observer) override {
    std::shared_ptr<ServingEngine> engine = serving();
    if (!engine) return observer->on_error(ErrorKind::CONFLICT, "no model is loaded");
    engine->submit(std::move(request), std::move(observer));
  }

  TrainStepReport train_step(const TrainBatch& batch, int64_t next_global_step, std::stop_token stop) override {
    SWARM_REQUIRE(trainer_ != nullptr, ErrorKind::CONFLICT, "no model is loaded");
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<ServingEngine> engine = serving();
    // The copy into the serving weights and the new version happen together between two
    // generation steps, so every token sampled afterwards is stamped with the version it came from.
    auto exclusive = [&](const std::function<void()>& sync) {
      auto sync_and_stamp = [&] {
        sync();
        if (engine) engine->set_policy_version(next_global_step);
      };
      if (engine) {
        engine->run_exclusive(sync_and_stamp);
      } else {
        sync_and_stamp();
      }
    };
    TrainStepReport report = summarize_batch(batch);
    report.global_step = next_global_step;
    trainer_dirty_ = true;  // until the step completes, the weights may be half-updated
    report.metrics = trainer_->train(batch, next_global_step, exclusive, stop);
    trainer_dirty_ = false;
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return report;
  }

  void save_checkpoint(const std::filesystem::path& dir) override {
    SWARM_REQUIRE(trainer_ != nullptr, ErrorKind::CONFLICT, "no model is loaded");
    SWARM_REQUIRE(!trainer_dirty_, ErrorKind::CONFLICT,
                  "the last policy step did not complete, so the weights are not those of any step");
    // The serving model holds the synced weights of the last step. Only weight sync writes them,
    // and it runs on this (control) thread, so reading them here races with nothing.
    save_hf_model(dir, *model_, model_dir_);
    save_trainer_state(dir / "trainer_state", *trainer_);
  }

  void set_policy_version(int64_t version) override {
    if (auto engine = serving()) engine->set_policy_version(version);
  }

  std::map<std::string, double> inference_metrics() const override {
    std::shared_ptr<ServingEngine> engine = serving();
    if (!engine) return {};
    const ServingStats s = engine->stats();
    return {{"running_sequences", double(s.running)},
            {"waiting_sequences", double(s.waiting)},
            {"kv_blocks_total", double(s.kv_blocks_total)},
            {"kv_blocks_free", double(s.kv_blocks_free)},
            {"steps_total", double(s.steps)},
            {"prefill_tokens_total", double(s.prefill_tokens)},
            {"decode_tokens_total", double(s.decode_tokens)},
            {"preemptions_total", double(s.preemptions)},
            {"cancelled_requests_total", double(s.cancelled_requests)},
            {"completed_requests_total", double(s.completed_requests)},
            {"failed_requests_total", double(s.failed_requests)},
            {"busy_seconds_total", s.busy_seconds}};
  }

  void release() override {
    std::shared_ptr<ServingEngine> engine;
    {
      std::lock_guard lk(engine_mu_);
      engine.swap(engine_);
    }
    if (engine) engine->shutdown("the engine was stopped");
    engine.reset();
    trainer_.reset();
    model_.reset();
  }

 private:
  std::shared_ptr<ServingEngine> serving() const {
    std::lock_guard lk(engine_mu_);
    return engine_;
  }

  Job job_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::string chat_template_error_;
  std::shared_ptr<DecoderModel> model_;
  std::unique_ptr<GrpoTrainer> trainer_;  // control thread only
  bool trainer_dirty_ = false;
  std::filesystem::path model_dir_;       // where the model was loaded from
  mutable std::mutex engine_mu_;  // guards engine_ (HTTP threads and /metrics read it)
  std::shared_ptr<ServingEngine> engine_;
  int64_t max_context_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_torch_backend() { return std::make_unique<TorchBackend>(); }

void register_torch_backend() { register_backend("torch", [] { return make_torch_backend(); }); }

}  // namespace swarm
