#include "engine/backend.hpp"

#include <cmath>
#include <mutex>

#include <nlohmann/json.hpp>

#include "engine/mock_backend.hpp"

namespace swarm {

void Backend::unsupported(const std::string& what) const {
  throw SwarmError(ErrorKind::INTERNAL, "backend '" + name() + "' does not support " + what);
}

std::vector<TokenId> Backend::render_chat(const nlohmann::ordered_json&, const nlohmann::ordered_json&,
                                          bool) const {
  unsupported("chat templates");
}
std::vector<TokenId> Backend::encode(const std::string&) const { unsupported("encode"); }
std::string Backend::decode(const std::vector<TokenId>&) const { unsupported("decode"); }
std::string Backend::token_text(TokenId) const { unsupported("token_text"); }
std::vector<TokenId> Backend::encode_rendered(const std::string&) const { unsupported("encode_rendered"); }
// NOLINTNEXTLINE(performance-unnecessary-value-param): the virtual's signature (overrides keep both)
void Backend::generate(GenerationRequest, std::shared_ptr<GenerationObserver> observer) {
  observer->on_error(ErrorKind::INTERNAL, "backend '" + name() + "' does not support generation");
}
TrainStepReport Backend::train_step(const TrainBatch&, int64_t, std::stop_token) { unsupported("training"); }
void Backend::save_checkpoint(const std::filesystem::path&) { unsupported("checkpoints"); }

TrainStepReport summarize_batch(const TrainBatch& batch) {
  TrainStepReport r;
  r.episodes = static_cast<int64_t>(batch.episodes.size());
  r.tasks = batch.num_tasks;
  double sum = 0, sq = 0;
  bool first = true;
  for (const auto& ep : batch.episodes) {
    sum += ep.reward;
    sq += ep.reward * ep.reward;
    if (first || ep.reward < r.reward_min) r.reward_min = ep.reward;
    if (first || ep.reward > r.reward_max) r.reward_max = ep.reward;
    first = false;
    for (const auto& s : ep.samples) {
      ++r.samples;
      r.tokens += static_cast<int64_t>(s.token_ids.size());
      for (uint8_t m : s.loss_mask) r.trained_tokens += m;
    }
  }
  if (r.episodes > 0) {
    r.reward_mean = sum / static_cast<double>(r.episodes);
    r.reward_std =
        std::sqrt(std::max(0.0, sq / static_cast<double>(r.episodes) - r.reward_mean * r.reward_mean));
  }
  // What the agents sent with their rewards (workflow_output.log_metrics), per name over the
  // episodes that sent it; the mean accumulates the sum first.
  for (const auto& ep : batch.episodes)
    for (const auto& [name, value] : ep.log_metrics) {
      auto it = r.log_metrics.find(name);
      if (it == r.log_metrics.end()) {
        if (r.log_metrics.size() >= kMaxStepLogMetrics) continue;
        r.log_metrics[name] = LogMetricStats{value, value, value, 1};
        continue;
      }
      LogMetricStats& st = it->second;
      st.mean += value;
      st.min = std::min(st.min, value);
      st.max = std::max(st.max, value);
      ++st.episodes;
    }
  for (auto& [name, st] : r.log_metrics) st.mean /= static_cast<double>(st.episodes);
  return r;
}

nlohmann::json log_metrics_json(const std::map<std::string, LogMetricStats>& stats) {
  const auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, st] : stats)
    out[name] = {{"mean", number(st.mean)},
                 {"min", number(st.min)},
                 {"max", number(st.max)},
                 {"episodes", st.episodes}};
  return out;
}

nlohmann::json rank_memory_json(const std::vector<RankMemory>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (const RankMemory& m : ranks)
    out.push_back({{"rank", m.rank},
                   {"device", m.device},
                   {"weights_bytes", m.weights_bytes},
                   {"serving_weights_bytes", m.serving_weights_bytes},
                   {"gradients_bytes", m.gradients_bytes},
                   {"optimizer_bytes", m.optimizer_bytes},
                   {"master_weights_bytes", m.master_weights_bytes},
                   {"kv_cache_bytes", m.kv_cache_bytes},
                   {"peak_bytes", m.peak_bytes},
                   {"activations_peak_bytes", m.activations_peak_bytes}});
  return out;
}

nlohmann::json rank_serving_json(const std::vector<RankServing>& ranks) {
  nlohmann::json out = nlohmann::json::array();
  for (const RankServing& r : ranks)
    out.push_back({{"rank", r.rank},
                   {"up", r.up},
                   {"requests", r.requests},
                   {"generated_tokens", r.generated_tokens},
                   {"in_flight", r.in_flight},
                   {"outstanding_tokens", r.outstanding_tokens}});
  return out;
}

RankMemory rank_memory_from_json(const nlohmann::json& j) {
  try {
    RankMemory m;
    m.rank = j.at("rank").get<int>();
    m.device = j.at("device").get<std::string>();
    m.weights_bytes = j.at("weights_bytes").get<int64_t>();
    m.serving_weights_bytes = j.at("serving_weights_bytes").get<int64_t>();
    m.gradients_bytes = j.at("gradients_bytes").get<int64_t>();
    m.optimizer_bytes = j.at("optimizer_bytes").get<int64_t>();
    m.master_weights_bytes = j.at("master_weights_bytes").get<int64_t>();
    m.kv_cache_bytes = j.at("kv_cache_bytes").get<int64_t>();
    m.peak_bytes = j.at("peak_bytes").get<int64_t>();
    m.activations_peak_bytes = j.value("activations_peak_bytes", int64_t{-1});
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, std::string("malformed rank memory report: ") + e.what());
  }
}

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, std::function<std::unique_ptr<Backend>()>> factories;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void register_backend(const std::string& name, std::function<std::unique_ptr<Backend>()> factory) {
  std::lock_guard lk(registry().mu);
  registry().factories[name] = std::move(factory);
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "mock") return std::make_unique<MockBackend>();
  {
    std::lock_guard lk(registry().mu);
    auto it = registry().factories.find(name);
    if (it != registry().factories.end()) return it->second();
  }
  std::string names;
  for (const auto& n : available_backends()) names += (names.empty() ? "" : ", ") + n;
  if (name == "torch")
    throw SwarmError(
        ErrorKind::INVALID_ARGUMENT,
        "the torch engine is not available: this build has no libtorch (available: " + names + ")");
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "unknown engine '" + name + "' (available: " + names + ")");
}

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"mock"};
  std::lock_guard lk(registry().mu);
  for (const auto& [name, factory] : registry().factories)
    if (name != "mock") names.push_back(name);
  return names;
}

}  // namespace swarm
