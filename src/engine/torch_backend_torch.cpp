// The torch backend: loads a Hugging Face model directory, serves it through the ServingEngine
// and trains it with the PolicyTrainer; weight sync is an in-process copy between the two.
#include "engine/torch_backend.hpp"
#include "engine/job_options.hpp"
#include "common/env.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <map>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/version.h>
#ifdef SWARM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "common/openmp_wait.hpp"
#include "dist/rank_channel.hpp"
#include "dist/serve_link.hpp"
#include "dist/shared_directory.hpp"
#include "engine/run_files.hpp"
#include "engine/rank_router.hpp"
#include "inference/decoder_model_torch.hpp"
#include "inference/kv_cache_torch.hpp"
#include "inference/serving_engine.hpp"
#include "kernels/cpu/cpu_dispatch.hpp"
#include "kernels/cpu/widening_linear_torch.hpp"
#include "swarm/job.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"
#include "trainer/checkpoint_torch.hpp"
#include "trainer/policy_trainer_torch.hpp"

namespace swarm {
namespace {

// Runs fn on a thread of its own, waits for it and hands back its result (or exception).
// libgomp keeps an OpenMP worker pool for every thread that has started a parallel region, for
// as long as that thread lives; once the pools' workers outnumber the CPUs, each worker spins
// only briefly before sleeping, so every parallel region of the serving step pays a futex
// wake-up (measured on 2 cores: SmolLM2 bf16 batch-1 step 5.6 -> 7.8 ms beside one idle extra
// pool). The control thread's libtorch work (boot, training, checkpoints) runs through this, so
// its pool ends with the thread and the serving thread's pool is the only one left.
template <class F>
auto on_own_thread(F&& fn) -> decltype(fn()) {
  std::packaged_task<decltype(fn())()> task(std::forward<F>(fn));
  auto result = task.get_future();
  std::thread(std::move(task)).join();
  return result.get();
}
// The compute dtype of job key `dtype`: fp32, bf16, or auto: bf16 where it computes fast (a GPU,
// a CPU with AVX512_BF16's dot products), fp32 on other CPUs, where bf16 matmuls are widened to
// fp32 GEMM anyway (widening_linear_torch.hpp) and bf16 would only round every activation.
// `why` (optional) gets the reason, for the log.
DType compute_dtype(const Job& job, const torch::Device& device, std::string* why = nullptr) {
  std::string reason;
  DType d = DType::F32;
  if (job.dtype == "bf16") {
    d = DType::BF16;
    reason = "dtype: bf16";
    if (device.is_cpu() && bf16_matmul_widens())
      reason +=
          std::string(" (CPU level ") + cpu_level_name(cpu_level()) + ": matmuls " + bf16_matmul_path() + ")";
  } else if (job.dtype == "auto") {
    const bool fast = device.is_cuda() || !bf16_matmul_widens();
    d = fast ? DType::BF16 : DType::F32;
    reason = std::string("dtype: auto -> ") + (fast ? "bf16" : "fp32") + " (" +
             (device.is_cuda() ? std::string("GPU")
                               : std::string("CPU level ") + cpu_level_name(cpu_level()) +
                                     (fast ? ": bf16 dot products" : ": no bf16 dot products")) +
             ")";
  } else {
    reason = "dtype: fp32";
  }
  if (why != nullptr) *why = reason;
  return d;
}

// How long rank 0 waits for the other ranks to load a model or write their optimizer shard.
constexpr std::chrono::minutes kFollowerLoadTimeout{10};

// Compute threads for one rank: the job's engine_threads, or this machine's cores split
// between the ranks that share it.
int compute_threads(const Job& job, int local_world_size) {
  if (job.engine_threads > 0) return static_cast<int>(job.engine_threads);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local_world_size));
}

// The one place the device is chosen (job key `device`): cpu, cuda (an error where this
// libtorch has no CUDA or sees no GPU), or auto (cuda when there is one, else cpu).
torch::Device rank_device(const DistConfig& dist, const std::string& wanted = "auto") {
  const bool cuda = torch::cuda::is_available();
  SWARM_REQUIRE(
      wanted != "cuda" || cuda, ErrorKind::INVALID_ARGUMENT,
      "device: cuda, but this swarm-server's libtorch has no CUDA or sees no GPU (build against a CUDA "
      "libtorch, docs/gpu.md; or use device: auto / cpu)");
  if (wanted == "cpu" || !cuda) return torch::Device(torch::kCPU);
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(dist.local_rank));
}

// The model directory a rank loads: the checkpoint when resuming, else the job's model.
std::filesystem::path model_directory(const Job& job, const std::filesystem::path& resume) {
  const std::filesystem::path dir = resume.empty() ? std::filesystem::path(job.model) : resume;
  SWARM_REQUIRE(std::filesystem::is_directory(dir), ErrorKind::INVALID_ARGUMENT,
                "model '" + dir.string() +
                    "' is not a directory (the torch engine needs a Hugging Face model directory)");
  SWARM_REQUIRE(std::filesystem::is_regular_file(dir / "config.json"), ErrorKind::INVALID_ARGUMENT,
                "model directory '" + dir.string() + "' has no config.json");
  return dir;
}

// What a training rank holds: the model in the compute dtype (rank 0 also serves from it) and
// the trainer over it, sharded through `comm`.
struct RankModel {
  std::shared_ptr<DecoderModel> model;
  std::unique_ptr<PolicyTrainer> trainer;
};

// The memory a KV cache could still take on `device`: on a GPU what the driver reports free
// plus what libtorch's caching allocator holds unused; 0 on the CPU (sized otherwise there).
int64_t device_free_bytes(const torch::Device& device) {
#ifdef SWARM_WITH_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard guard(device.index());
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return 0;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<int64_t>(free) + stats.reserved_bytes[0].current - stats.allocated_bytes[0].current;
  }
#endif
  (void)device;
  return 0;
}

// The process's peak on `device`: what the CUDA caching allocator reserved at most on a GPU,
// the peak resident set (VmHWM) on the CPU.
int64_t peak_bytes(const torch::Device& device) {
#ifdef SWARM_WITH_CUDA
  if (device.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).reserved_bytes[0].peak;
#endif
  (void)device;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:   123456 kB"
  return 0;
}

// What this rank holds: the trainer's buffers, the serving copy of the weights, the KV cache.
RankMemory measure_memory(int rank, const DecoderModel& serving, const PolicyTrainer& trainer,
                          const ServingEngine* engine) {
  RankMemory m;
  m.rank = rank;
  m.device = serving.device().str();
  const FlatParameters::Memory t = trainer.memory();
  m.weights_bytes = t.weights;
  m.gradients_bytes = t.gradients;
  m.optimizer_bytes = t.optimizer;
  m.master_weights_bytes = t.master;
  if (!trainer.shares_serving_weights())  // else they are the trainer's weights, counted above
    for (const auto& [name, p] : serving.parameters())
      m.serving_weights_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  if (engine) m.kv_cache_bytes = engine->kv_cache_bytes();
  m.peak_bytes = peak_bytes(serving.device());
  m.activations_peak_bytes = trainer.activations_peak_bytes();
  return m;
}

void log_memory(const std::vector<RankMemory>& ranks, const std::string& when) {
  const auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  for (const RankMemory& m : ranks)
    spdlog::info(
        "torch engine: memory {} on rank {} ({}): weights {:.1f} MiB, serving weights {:.1f} MiB, gradients "
        "{:.1f} MiB, optimizer {:.1f} MiB, master weights {:.1f} MiB, KV cache {:.1f} MiB; peak {:.1f} MiB, "
        "last step's activations peak {}",
        when, m.rank, m.device, mib(m.weights_bytes), mib(m.serving_weights_bytes), mib(m.gradients_bytes),
        mib(m.optimizer_bytes), mib(m.master_weights_bytes), mib(m.kv_cache_bytes), mib(m.peak_bytes),
        m.activations_peak_bytes < 0 ? std::string("n/a")
                                     : fmt::format("{:.1f} MiB", mib(m.activations_peak_bytes)));
}

RankModel load_rank_model(const Job& job, const std::filesystem::path& dir, bool resuming,
                          torch::Device device, std::shared_ptr<Collectives> comm) {
  const DType dtype = compute_dtype(job, device);
  RankModel r;
  r.model = DecoderModel::load(dir, dtype, device);
  // bf16 computes in bf16 but keeps fp32 master weights: seed them from the checkpoint's own
  // precision, not from the rounded bf16 copy (a resumed run restores them from its state).
  // (The checkpoint's tensors, zero-copy over its files: each rank widens its own shard of them,
  // so no full fp32 copy of the model is made.)
  NamedTensors master;
  if (dtype != DType::F32 && !resuming) master = checkpoint_tensors(dir, *r.model);
  // PPO with critic_model: the critic's trunk is that directory (its layout even when resuming:
  // the checkpoint's trainer state then holds its trained weights).
  std::shared_ptr<DecoderModel> critic;
  NamedTensors critic_master;
  if (job.algorithm == "ppo" && !job.critic_model.empty()) {
    critic = DecoderModel::load(model_directory(job, job.critic_model), dtype, device);
    if (dtype != DType::F32 && !resuming) critic_master = checkpoint_tensors(job.critic_model, *critic);
  }
  // The KL reference is the job's initial model, also when resuming: the checkpoint holds the
  // trained weights (and no reference), so the job's model is loaded again (in fp32; the trainer
  // rounds it to its training dtype as it did the first time).
  std::shared_ptr<DecoderModel> reference;
  if (job.use_kl_loss && resuming) {
    SWARM_REQUIRE(std::filesystem::is_regular_file(std::filesystem::path(job.model) / "config.json"),
                  ErrorKind::INVALID_ARGUMENT,
                  "use_kl_loss: resuming needs the job's model '" + job.model +
                      "' (the frozen KL reference), and it is not a model directory");
    reference = DecoderModel::load(job.model, DType::F32, device);
  }
  TrainerOptions options = trainer_options_from(job);
  // gradient_checkpointing auto: on a GPU, where activations bound the sequence length; on the
  // CPU the recomputation's third more compute costs more than the memory it frees.
  if (job.gradient_checkpointing == "auto") options.forward.checkpoint_layers = device.is_cuda();
  // One weight copy when training is synchronous: generation is paused during each step (no
  // sequence samples from half-updated weights); asynchronous training keeps a serving copy.
  options.share_serving_weights = job.max_staleness == 0;
  r.trainer = std::make_unique<PolicyTrainer>(
      r.model, options, std::move(comm), master.empty() ? nullptr : &master, critic.get(),
      critic_master.empty() ? nullptr : &critic_master, reference.get());
  r.model = r.trainer->serving_model();  // the loaded copy is dropped when the trainer replaced it
  if (resuming) load_trainer_state(dir / "trainer_state", *r.trainer);
  return r;
}

// The context limit and the serving engine's settings for `model` under `job`: the same on
// every rank, so each answers a request as rank 0 would.
int64_t serving_context(const Job& job, const DecoderModel& model) {
  return std::min(job.max_prompt_length + job.max_response_length, model.config().max_position_embeddings);
}

ServingConfig rank_serving_config(const Job& job, const DecoderModel& model, const Tokenizer& tokenizer) {
  const ModelConfig& cfg = model.config();
  ServingModelFacts facts;
  facts.max_context = serving_context(job, model);
  for (int64_t id : cfg.stop_token_ids()) facts.stop_token_ids.push_back(static_cast<TokenId>(id));
  facts.tokenizer_eos = tokenizer.eos_id();
  facts.kv_bytes_per_token = KvCache::bytes_per_block(cfg, 1, model.scalar_type());
  facts.device_free_bytes = device_free_bytes(model.device());
  return serving_config_from(job, facts);
}

// The weight swap of a policy step on a serving rank: the copy into the serving weights and
// the new version happen together between two generation steps, so every token sampled
// afterwards is stamped with the version it came from; sequences generating across the swap
// keep their KV cache or are prefilled again with the new weights (kv_cache_on_swap).
// free_kv_cache_during_training for this job on `device`: auto means on a GPU when training is
// synchronous (max_staleness 0), where the cache's memory is worth more to the trainer.
bool frees_kv_cache_during_training(const Job& job, torch::Device device) {
  if (job.free_kv_cache_during_training == "auto") return device.is_cuda() && job.max_staleness == 0;
  return job.free_kv_cache_during_training == "true" && job.max_staleness == 0;
}

// The serving engine paused for one training step (the scope of this object) and resumed when
// it ends, after the weight sync, also when the step fails: where the serving model reads the
// trainer's weights (one weight copy), and to free the KV cache's memory meanwhile.
class GenerationPausedForStep {
 public:
  GenerationPausedForStep(ServingEngine* engine, bool shared_weights, bool free_kv_cache, int rank) {
    if (engine == nullptr || (!shared_weights && !free_kv_cache)) return;
    freed_ = engine->pause_generation(free_kv_cache);
    engine_ = engine;
    if (free_kv_cache)
      spdlog::debug("rank {}: KV cache freed for the training step ({:.1f} MiB)", rank,
                    static_cast<double>(freed_) / (1 << 20));
  }
  ~GenerationPausedForStep() {
    if (engine_ == nullptr) return;
    try {
      engine_->resume_generation();
    } catch (const std::exception& e) {  // shutting down: nothing left to serve
      spdlog::warn("generation not resumed after the training step: {}", e.what());
    }
  }
  GenerationPausedForStep(const GenerationPausedForStep&) = delete;
  GenerationPausedForStep& operator=(const GenerationPausedForStep&) = delete;
  int64_t freed() const noexcept { return freed_; }

 private:
  ServingEngine* engine_ = nullptr;
  int64_t freed_ = 0;
};

void swap_weights(ServingEngine* engine, const Job& job, int64_t version, const std::function<void()>& sync) {
  if (!engine) return sync();
  engine->run_exclusive([&] {
    sync();
    engine->set_policy_version(version);
    if (job.kv_cache_on_swap == "recompute") engine->recompute_running();
  });
}

// Rank 0's view of a routed request: counts it for the router when it ends, then passes every
// call on to the request's own observer.
class RoutedObserver final : public GenerationObserver {
 public:
  RoutedObserver(std::shared_ptr<GenerationObserver> inner, std::shared_ptr<RankRouter> router, int rank,
                 int64_t tokens)
      : inner_(std::move(inner)), router_(std::move(router)), rank_(rank), tokens_(tokens) {}
  void on_text(int64_t choice, const std::string& delta) override { inner_->on_text(choice, delta); }
  void on_complete(GenerationResult result) override {
    int64_t generated = 0;
    for (const GenerationChoice& c : result.choices) generated += static_cast<int64_t>(c.ids.size());
    router_->finish(rank_, tokens_, generated);
    inner_->on_complete(std::move(result));
  }
  void on_error(ErrorKind kind, const std::string& message) override {
    router_->finish(rank_, tokens_, 0);
    inner_->on_error(kind, message);
  }
  bool cancelled() const override { return inner_->cancelled(); }

 private:
  std::shared_ptr<GenerationObserver> inner_;
  std::shared_ptr<RankRouter> router_;
  const int rank_;
  const int64_t tokens_;
};

class TorchBackend final : public Backend {
 public:
  /// `followers` (may be null) are the other ranks of a multi-rank job; this is then rank 0.
  TorchBackend(std::shared_ptr<RankLeader> followers, DistConfig dist)
      : followers_(std::move(followers)), dist_(std::move(dist)) {}
  ~TorchBackend() override { release_followers(); }

  std::string name() const override { return "torch"; }

  void boot(const Job& job, std::stop_token stop) override {
    on_own_thread([&] { boot_on_this_thread(job, stop); });
  }

  void boot_on_this_thread(const Job& job, std::stop_token stop) {
    // A resumed run loads the checkpoint's model directory (same files, trained weights).
    const std::filesystem::path dir = model_directory(job, resume_checkpoint_);
    first_step_measured_ = false;
    if (!followers_) {
      {
        std::lock_guard lk(engine_mu_);
        router_ = std::make_shared<RankRouter>(1);
      }
      boot_rank0(job, dir, stop, nullptr);
      record_memory({}, "after boot");
      return;
    }
    SWARM_REQUIRE(followers_->broken().empty(), ErrorKind::UNAVAILABLE,
                  "the multi-rank job is broken (" + followers_->broken() + "); restart swarm-server");
    // Every boot rendezvouses afresh for c10d (a failed job's process group is unusable), on a
    // port rank 0 picks; the control channel tells the others which.
    DistConfig dist = dist_;
    dist.master_port = pick_free_port(dist.master_addr);
    // Every rank serves: each follower opens its serving link to this port (serve_link.hpp).
    const int serve_port = pick_free_port(dist.master_addr);
    // Every rank writes its optimizer shard into the experiment directory: each checks, before
    // anything loads, that it sees the one rank 0 does (shared_directory.hpp).
    {
      const SharedDirectoryProbe probe = write_shared_directory_probe(experiment_path(job));
      struct RemoveProbe {
        const SharedDirectoryProbe& probe;
        ~RemoveProbe() { remove_shared_directory_probe(probe); }
      } remove_probe{probe};
      followers_->request(RankMessage{{{"kind", "check_shared"},
                                       {"directory", probe.directory},
                                       {"file", probe.file},
                                       {"token", probe.token}},
                                      {}},
                          std::chrono::seconds(60));
    }
    followers_->send_all(RankMessage{{{"kind", "boot"},
                                      {"job", job.to_yaml()},
                                      {"resume", resume_checkpoint_.string()},
                                      {"store_port", dist.master_port},
                                      {"serve_port", serve_port}},
                                     {}});
    followers_booted_ = true;
    bool replies_pending = true;
    try {
      open_serving_links(dist, serve_port);
      std::shared_ptr<Collectives> comm = make_collectives(dist, rank_device(dist, job.device).is_cuda());
      boot_rank0(job, dir, stop, std::move(comm));
      replies_pending = false;
      record_memory(followers_->collect(kFollowerLoadTimeout), "after boot");
    } catch (...) {
      if (replies_pending) {
        try {
          followers_->collect(kFollowerLoadTimeout);
        } catch (const std::exception&) {  // this boot fails anyway, with rank 0's error
        }
      }
      close_serving_links();
      trainer_.reset();
      release_followers();
      throw;
    }
    spdlog::info("torch engine: {} ranks ({} collectives) booted", dist.world_size,
                 trainer_->collectives().backend_name());
  }

  void boot_rank0(const Job& job, const std::filesystem::path& dir, std::stop_token stop,
                  std::shared_ptr<Collectives> comm) {
    const auto cancelled = [&] {
      if (stop.stop_requested()) throw SwarmError(ErrorKind::CONFLICT, "boot cancelled");
    };
    const bool resuming = !resume_checkpoint_.empty();
    model_dir_ = dir;
    job_ = job;
    const int threads = compute_threads(job, dist_.local_world_size);
    const torch::Device device = rank_device(dist_, job.device);
    std::string dtype_reason;
    const DType dtype = compute_dtype(job, device, &dtype_reason);
    const ThreadPlan plan = configure_compute_threads(threads, dtype);

    tokenizer_ = Tokenizer::from_directory(dir.string());
    try {
      chat_template_.emplace(ChatTemplate::from_directory(dir.string()));
    } catch (const SwarmError& e) {
      chat_template_error_ = e.what();  // completions still work; chat requests get this error
    }
    cancelled();

    RankModel loaded = load_rank_model(job, dir, resuming, device, std::move(comm));
    model_ = std::move(loaded.model);
    trainer_ = std::move(loaded.trainer);
    cancelled();
    const ModelConfig& cfg = model_->config();
    if (tokenizer_->vocab_size() > cfg.vocab_size)
      spdlog::warn("torch engine: the tokenizer has {} ids but the model only {}; ids beyond it are rejected",
                   tokenizer_->vocab_size(), cfg.vocab_size);

    max_context_ = serving_context(job, *model_);
    const ServingConfig sc = rank_serving_config(job, *model_, *tokenizer_);
    auto engine = std::make_shared<ServingEngine>(model_, tokenizer_, sc);
    engine->set_policy_version(0);
    {
      std::lock_guard lk(engine_mu_);
      engine_ = engine;
    }
    spdlog::info(
        "torch engine: {} ({}, {} parameters, {}) on {} with {} threads (libtorch {}, OpenBLAS {}{}; {}); "
        "context {} "
        "tokens; KV cache {} tokens ({:.1f} MiB); batch {} sequences / {} tokens per step",
        job.model, cfg.architecture_name, cfg.parameter_count(), dtype_reason, device.str(), threads,
        plan.torch_threads, plan.openblas_threads,
        plan.gemm_splits ? ", GEMMs split over libtorch's threads" : "", openmp_wait_setting(), max_context_,
        sc.kv_cache_tokens, static_cast<double>(engine->kv_cache_bytes()) / (1 << 20), sc.max_batch_sequences,
        sc.max_step_tokens);
  }

  std::string model_id() const override { return job_.model; }
  int64_t max_context_length() const override { return max_context_; }

  std::vector<TokenId> render_chat(const nlohmann::ordered_json& messages,
                                   const nlohmann::ordered_json& tools,
                                   bool add_generation_prompt) const override {
    return render_chat_with_kwargs(messages, tools, add_generation_prompt, nlohmann::ordered_json::object());
  }

  std::string chat_template_source() const override { return chat_template_ ? chat_template_->source() : ""; }

  std::vector<TokenId> render_chat_with_kwargs(const nlohmann::ordered_json& messages,
                                               const nlohmann::ordered_json& tools,
                                               bool add_generation_prompt,
                                               const nlohmann::ordered_json& template_kwargs) const override {
    // As Hugging Face's apply_chat_template(tokenize=True): the template already wrote any BOS.
    return encode_rendered(*render_chat_text(messages, tools, add_generation_prompt, template_kwargs));
  }

  std::optional<std::string> render_chat_text(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                              const nlohmann::ordered_json& template_kwargs) const override {
    SWARM_REQUIRE(chat_template_.has_value(), ErrorKind::INVALID_ARGUMENT,
                  "this model has no chat template (" + chat_template_error_ + "); use /v1/completions");
    SWARM_REQUIRE(messages.is_array() && !messages.empty(), ErrorKind::INVALID_ARGUMENT,
                  "'messages' must be a non-empty array");
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto& m = messages[i];
      SWARM_REQUIRE(m.is_object() && m.contains("role") && m["role"].is_string(), ErrorKind::INVALID_ARGUMENT,
                    "messages[" + std::to_string(i) + "] must be an object with a string 'role'");
    }
    return chat_template_->render(
        messages, tools, add_generation_prompt,
        template_kwargs.is_object() ? template_kwargs : nlohmann::ordered_json::object());
  }

  std::vector<TokenId> encode_rendered(const std::string& text) const override {
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

  // Every rank serves: the router picks one (rank_router.hpp), rank 0's own engine or a
  // follower's over its serving link; either answers through the same observer calls.
  void generate(GenerationRequest request, std::shared_ptr<GenerationObserver> observer) override {
    std::shared_ptr<ServingEngine> engine;
    std::shared_ptr<RankRouter> router;
    std::vector<std::shared_ptr<ServeLinkLeader>> links;
    {
      std::lock_guard lk(engine_mu_);
      engine = engine_;
      router = router_;
      links = links_;
    }
    if (!engine || !router) return observer->on_error(ErrorKind::CONFLICT, "no model is loaded");
    const int64_t tokens =
        static_cast<int64_t>(request.prompt_ids.size()) +
        std::max<int64_t>(request.params.max_tokens, 0) * std::max<int64_t>(request.params.n, 1);
    const int rank = router->route(request.affinity, tokens);
    if (rank < 0) return observer->on_error(ErrorKind::UNAVAILABLE, "no rank of this job is serving");
    auto routed = std::make_shared<RoutedObserver>(std::move(observer), router, rank, tokens);
    if (rank == 0) return engine->submit(std::move(request), std::move(routed));
    if (static_cast<size_t>(rank) > links.size())
      return routed->on_error(ErrorKind::UNAVAILABLE, "rank " + std::to_string(rank) + " is not serving");
    links[static_cast<size_t>(rank - 1)]->submit(request, routed);
  }

  TrainStepReport train_step(const TrainBatch& batch, int64_t next_global_step,
                             std::stop_token stop) override {
    return on_own_thread([&] { return train_step_on_this_thread(batch, next_global_step, stop); });
  }

  TrainStepReport train_step_on_this_thread(const TrainBatch& batch, int64_t next_global_step,
                                            std::stop_token stop) {
    SWARM_REQUIRE(trainer_ != nullptr, ErrorKind::CONFLICT, "no model is loaded");
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<ServingEngine> engine = serving();
    // The copy into the serving weights and the new version happen together between two
    // generation steps, so every token sampled afterwards is stamped with the version it came from.
    auto exclusive = [&](const std::function<void()>& sync) {
      swap_weights(engine.get(), job_, next_global_step, [&] {
        notify_swap(true);
        sync();
        notify_swap(false);
      });
    };
    TrainStepReport report = summarize_batch(batch);
    report.global_step = next_global_step;
    // Until the step completes, the weights may be half-updated. A step stopped before its
    // first optimizer step (stop_engine during WEIGHT_SYNCING) leaves them as they were.
    trainer_dirty_ = true;
    const int64_t optimizer_steps_before = trainer_->optimizer_steps();
    struct CleanIfUntouched {
      TorchBackend& b;
      int64_t before;
      ~CleanIfUntouched() {
        if (b.trainer_ && b.trainer_->optimizer_steps() == before) b.trainer_dirty_ = false;
      }
    } clean_if_untouched{*this, optimizer_steps_before};
    std::vector<nlohmann::json> replies;
    std::optional<GenerationPausedForStep> freed;
    freed.emplace(engine.get(), trainer_->shares_serving_weights(),
                  frees_kv_cache_during_training(job_, model_->device()), 0);
    if (!followers_) {
      report.metrics = trainer_->train(batch, next_global_step, exclusive, stop);
    } else {
      // Every rank gets the whole batch (advantages need whole task groups) and trains its
      // share of the sequences; the gradients meet in the collectives.
      followers_->send_all(
          RankMessage{{{"kind", "train"}, {"step", next_global_step}}, serialize_train_batch(batch)});
      std::string error;
      try {
        report.metrics = trainer_->train(batch, next_global_step, exclusive, stop);
      } catch (const std::exception& e) {
        error = std::string("rank 0: ") + e.what();
      }
      try {
        replies = followers_->collect(dist_.timeout + std::chrono::seconds(30));
      } catch (const std::exception& e) {
        error += (error.empty() ? "" : "; ") + std::string(e.what());
      }
      SWARM_REQUIRE(error.empty(), ErrorKind::UNAVAILABLE, "training step failed: " + error);
    }
    report.metrics["kv_cache_freed_bytes"] = static_cast<double>(freed->freed());
    if (freed->freed() > 0 && !first_step_measured_)
      spdlog::info(
          "torch engine: the KV cache ({:.1f} MiB per rank) is freed during each training step "
          "(free_kv_cache_during_training)",
          static_cast<double>(freed->freed()) / (1 << 20));
    freed.reset();  // the weights are synced: serve again
    trainer_dirty_ = false;
    record_memory(replies, first_step_measured_ ? "" : "after the first step");
    first_step_measured_ = true;
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return report;
  }

  void save_checkpoint(const std::filesystem::path& dir) override {
    on_own_thread([&] { save_checkpoint_on_this_thread(dir); });
  }

  void save_checkpoint_on_this_thread(const std::filesystem::path& dir) {
    SWARM_REQUIRE(trainer_ != nullptr, ErrorKind::CONFLICT, "no model is loaded");
    SWARM_REQUIRE(!trainer_dirty_, ErrorKind::CONFLICT,
                  "the last policy step did not complete, so the weights are not those of any step");
    // The serving model holds the synced weights of the last step. Only weight sync writes them,
    // and the control thread waits for each step (and its sync) to end before it can ask for
    // a checkpoint, so reading them here races with nothing.
    save_hf_model(dir, *model_, model_dir_);
    save_trainer_state(dir / "trainer_state", *trainer_);
    // The other ranks write their optimizer shards beside rank 0's (a shared filesystem).
    if (followers_)
      followers_->request(RankMessage{{{"kind", "save"}, {"dir", dir.string()}}, {}}, kFollowerLoadTimeout);
  }

  void set_policy_version(int64_t version) override {
    std::vector<std::shared_ptr<ServeLinkLeader>> links;
    {
      std::lock_guard lk(engine_mu_);
      if (engine_) engine_->set_policy_version(version);
      links = links_;
    }
    for (const auto& link : links) link->set_policy_version(version);
  }

  std::vector<RankServing> rank_serving() const override {
    std::shared_ptr<RankRouter> router;
    {
      std::lock_guard lk(engine_mu_);
      router = router_;
    }
    return router ? router->counters() : std::vector<RankServing>{};
  }

  std::vector<RankMemory> memory() const override {
    std::lock_guard lk(memory_mu_);
    return memory_;
  }

  std::map<std::string, double> inference_metrics() const override {
    std::shared_ptr<ServingEngine> engine = serving();
    if (!engine) return {};
    const ServingStats s = engine->stats();
    return {{"running_sequences", double(s.running)},
            {"waiting_sequences", double(s.waiting)},
            {"kv_blocks_total", double(s.kv_blocks_total)},
            {"kv_blocks_free", double(s.kv_blocks_free)},
            {"kv_blocks_cached", double(s.kv_blocks_cached)},
            {"prefix_cache_queries_tokens_total", double(s.prefix_cache_queries_tokens)},
            {"prefix_cache_hit_tokens_total", double(s.prefix_cache_hit_tokens)},
            {"steps_total", double(s.steps)},
            {"prefill_tokens_total", double(s.prefill_tokens)},
            {"decode_tokens_total", double(s.decode_tokens)},
            {"preemptions_total", double(s.preemptions)},
            {"cancelled_requests_total", double(s.cancelled_requests)},
            {"completed_requests_total", double(s.completed_requests)},
            {"failed_requests_total", double(s.failed_requests)},
            {"busy_seconds_total", s.busy_seconds},
            {"latency_window_requests", double(s.latency_samples)},
            {"queue_wait_p50_seconds", s.queue_wait_p50_seconds},
            {"queue_wait_p99_seconds", s.queue_wait_p99_seconds},
            {"ttft_p50_seconds", s.ttft_p50_seconds},
            {"ttft_p99_seconds", s.ttft_p99_seconds},
            {"step_p50_seconds", s.step_p50_seconds},
            {"step_p99_seconds", s.step_p99_seconds}};
  }

  void release() override {
    std::shared_ptr<ServingEngine> engine;
    {
      std::lock_guard lk(engine_mu_);
      engine.swap(engine_);
    }
    if (engine) engine->shutdown("the engine was stopped");
    engine.reset();
    close_serving_links();
    trainer_.reset();
    model_.reset();
    release_followers();
  }

 private:
  // Tells the other ranks to drop their model and trainer (they then wait for the next boot).
  void release_followers() noexcept {
    if (!followers_ || !followers_booted_) return;
    followers_booted_ = false;
    try {
      followers_->request(RankMessage{{{"kind", "release"}}, {}}, kFollowerLoadTimeout);
    } catch (const std::exception& e) {
      spdlog::error("torch engine: releasing the other ranks failed: {}", e.what());
    }
  }

  // Accepts every follower's serving link on `port` (they connect when told to boot).
  void open_serving_links(const DistConfig& dist, int port) {
    auto joined = RankLeader::accept(dist.master_addr, port, dist.world_size, dist.timeout, dist.secret);
    std::vector<int> fds = joined->take_connections();
    std::vector<std::shared_ptr<ServeLinkLeader>> links;
    auto router = std::make_shared<RankRouter>(dist.world_size);
    for (size_t i = 0; i < fds.size(); ++i) {
      const int rank = static_cast<int>(i) + 1;
      links.push_back(std::make_shared<ServeLinkLeader>(fds[i], rank, [router, rank](const std::string&) {
        router->set_down(rank);  // the run itself stops at the next policy step (the control channel)
      }));
    }
    std::lock_guard lk(engine_mu_);
    links_ = std::move(links);
    router_ = std::move(router);
  }

  // Closes the serving links: what a follower still generates fails with UNAVAILABLE.
  void close_serving_links() {
    std::vector<std::shared_ptr<ServeLinkLeader>> links;
    {
      std::lock_guard lk(engine_mu_);
      links.swap(links_);
    }
    links.clear();  // joins their readers
  }

  std::shared_ptr<ServingEngine> serving() const {
    std::lock_guard lk(engine_mu_);
    return engine_;
  }

  // This rank's memory and what the followers replied with (their boot and train replies carry
  // theirs), kept for memory(); logged when `when` is not empty. A malformed reply is logged
  // and left out: a report is no reason to fail a step.
  void record_memory(const std::vector<nlohmann::json>& replies, const std::string& when) {
    std::vector<RankMemory> ranks;
    if (model_ && trainer_) ranks.push_back(measure_memory(0, *model_, *trainer_, serving().get()));
    for (size_t i = 0; i < replies.size(); ++i) {
      if (!replies[i].contains("memory")) continue;
      try {
        ranks.push_back(rank_memory_from_json(replies[i]["memory"]));
      } catch (const std::exception& e) {
        spdlog::warn("torch engine: rank {}'s memory report: {}", i + 1, e.what());
      }
    }
    if (!when.empty()) log_memory(ranks, when);
    std::lock_guard lk(memory_mu_);
    memory_ = std::move(ranks);
  }

  Job job_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::string chat_template_error_;
  std::shared_ptr<DecoderModel> model_;
  std::unique_ptr<PolicyTrainer> trainer_;  // control thread only
  bool trainer_dirty_ = false;
  std::filesystem::path model_dir_;  // where the model was loaded from
  mutable std::mutex engine_mu_;     // guards engine_, router_, links_ (HTTP threads and /metrics read them)
  std::shared_ptr<ServingEngine> engine_;
  std::shared_ptr<RankRouter> router_;  // which rank serves a request (kept after release: counters)
  std::vector<std::shared_ptr<ServeLinkLeader>> links_;  // links_[r - 1]: rank r's serving link
  int64_t max_context_ = 0;
  std::shared_ptr<RankLeader> followers_;  // null on one rank; control thread only
  bool followers_booted_ = false;          // the followers hold (or are loading) a model
  bool first_step_measured_ = false;       // memory logged after this boot's first step
  mutable std::mutex memory_mu_;           // guards memory_ (status readers)
  std::vector<RankMemory> memory_;         // every rank's, rank order
  DistConfig dist_;
};

}  // namespace

std::unique_ptr<Backend> make_torch_backend() {
  return std::make_unique<TorchBackend>(nullptr, DistConfig{});
}

void register_torch_backend() {
  register_backend("torch", [] { return make_torch_backend(); });
}

void register_torch_backend(std::shared_ptr<RankLeader> followers, const DistConfig& dist) {
  register_backend("torch", [followers, dist] { return std::make_unique<TorchBackend>(followers, dist); });
}

int run_torch_follower(const DistConfig& dist) {
  auto channel =
      RankFollower::connect(dist.master_addr, dist.master_port, dist.rank, dist.timeout, dist.secret);
  spdlog::info("rank {} of {}: joined rank 0 at {}:{}", dist.rank, dist.world_size, dist.master_addr,
               dist.master_port);
  // What a boot loads: the model and trainer, and the serving engine over the same weights that
  // answers what rank 0 routes here through the serving link. Released in reverse order.
  struct Held {
    Job job;
    std::optional<RankModel> model;
    std::shared_ptr<ServingEngine> engine;
    std::unique_ptr<ServeLinkFollower> link;
    ~Held() {
      link.reset();  // no more requests; replies of what is still running go nowhere
      if (engine) engine->shutdown("the engine was stopped");
    }
  };
  std::unique_ptr<Held> held;
  for (;;) {
    std::optional<RankMessage> message = channel->receive();
    if (!message) {
      spdlog::info("rank {}: rank 0 closed the job; exiting", dist.rank);
      return 0;
    }
    const std::string kind = message->header.value("kind", "");
    nlohmann::json reply = nlohmann::json::object();
    // Boot and train replies carry this rank's memory (rank 0 reports every rank's).
    const auto with_memory = [&] {
      reply["memory"] = rank_memory_json(
          {measure_memory(dist.rank, *held->model->model, *held->model->trainer, held->engine.get())})[0];
    };
    try {
      if (kind == "boot") {
        held.reset();
        // The serving link first: rank 0 waits for it before it loads its own model.
        const int serve_fd =
            RankFollower::connect(dist.master_addr, message->header.at("serve_port").get<int>(), dist.rank,
                                  dist.timeout, dist.secret)
                ->take_connection();
        const std::filesystem::path resume = message->header.value("resume", std::string());
        struct CloseUnlessTaken {
          int fd;
          ~CloseUnlessTaken() {
            if (fd >= 0) ::close(fd);
          }
        } serve_guard{serve_fd};
        auto next = std::make_unique<Held>();
        next->job = Job::from_yaml(message->header.at("job").get<std::string>());
        const Job& job = next->job;
        on_own_thread([&] {
          const std::filesystem::path dir = model_directory(job, resume);
          DistConfig store = dist;
          store.master_port = message->header.at("store_port").get<int>();
          const torch::Device device = rank_device(dist, job.device);
          std::shared_ptr<Collectives> comm = make_collectives(store, device.is_cuda());
          configure_compute_threads(compute_threads(job, dist.local_world_size), compute_dtype(job, device));
          next->model = load_rank_model(job, dir, !resume.empty(), device, std::move(comm));
          const auto tokenizer = Tokenizer::from_directory(dir.string());
          next->engine = std::make_shared<ServingEngine>(
              next->model->model, tokenizer, rank_serving_config(job, *next->model->model, *tokenizer));
          spdlog::info(
              "rank {}: loaded {} ({} optimizer values on this rank); serving with a KV cache of {:.1f} MiB",
              dist.rank, dir.string(),
              (next->model->trainer->parameter_count() + dist.world_size - 1) / dist.world_size,
              static_cast<double>(next->engine->kv_cache_bytes()) / (1 << 20));
        });
        serve_guard.fd = -1;  // the link owns it now
        next->link = std::make_unique<ServeLinkFollower>(
            serve_fd, dist.rank,
            [engine = next->engine](GenerationRequest request, std::shared_ptr<GenerationObserver> observer) {
              engine->submit(std::move(request), std::move(observer));
            },
            [engine = next->engine](int64_t version) { engine->set_policy_version(version); });
        held = std::move(next);
        with_memory();
      } else if (kind == "check_shared") {
        check_shared_directory_probe(
            {message->header.at("directory").get<std::string>(),
             message->header.at("file").get<std::string>(), message->header.at("token").get<std::string>()},
            dist.rank);
      } else if (kind == "train") {
        SWARM_REQUIRE(held != nullptr, ErrorKind::CONFLICT, "no model is loaded on this rank");
        const TrainBatch batch = deserialize_train_batch(message->payload);
        const int64_t step = message->header.at("step").get<int64_t>();
        try {
          on_own_thread([&] {
            const GenerationPausedForStep paused(
                held->engine.get(), held->model->trainer->shares_serving_weights(),
                frees_kv_cache_during_training(held->job, held->model->model->device()), dist.rank);
            held->model->trainer->train(batch, step, [&](const std::function<void()>& sync) {
              swap_weights(held->engine.get(), held->job, step, sync);
            });
          });
        } catch (...) {
          held.reset();  // half-updated weights: rank 0 ends the run and will boot afresh
          throw;
        }
        spdlog::debug("rank {}: step {} done", dist.rank, step);
        with_memory();
      } else if (kind == "save") {
        SWARM_REQUIRE(held != nullptr, ErrorKind::CONFLICT, "no model is loaded on this rank");
        save_trainer_state(
            std::filesystem::path(message->header.at("dir").get<std::string>()) / "trainer_state",
            *held->model->trainer);
      } else if (kind == "release") {
        held.reset();
      } else {
        throw SwarmError(ErrorKind::INVALID_ARGUMENT, "unknown command '" + kind + "' from rank 0");
      }
      channel->reply_ok(std::move(reply));
    } catch (const std::exception& e) {
      spdlog::error("rank {}: {} failed: {}", dist.rank, kind, e.what());
      channel->reply_error(e.what());
    }
  }
}

std::string compute_paths_summary() {
  std::string cpu = "unknown CPU";
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  std::string s = "CPU " + cpu + ", kernel level " + cpu_level_name(cpu_level());
  if (const auto forced = env_value("SWARM_CPU_LEVEL")) s += " (SWARM_CPU_LEVEL=" + *forced + ")";
  s += "; bf16 matmuls " + bf16_matmul_path();
  s += "; libtorch " + std::string(TORCH_VERSION) + " (ATen kernels " + aten_cpu_capability() + ", oneDNN " +
       onednn_cpu_isa() + ")";
  if (torch::cuda::is_available())
    s += ", " + std::to_string(torch::cuda::device_count()) + " CUDA device(s)";
  return s;
}

}  // namespace swarm
