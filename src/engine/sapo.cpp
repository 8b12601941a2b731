#include "engine/sapo.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include "common/error.hpp"
#include "engine/backend.hpp"
#include "engine/job_options.hpp"
#include "rollout_pool/context_tracker.hpp"

namespace swarm {

using OJson = nlohmann::ordered_json;

std::vector<SapoGroup> sapo_groups_of_batch(const TrainBatch& batch, const std::string& node_id,
                                            const std::string& model, int64_t policy_step, double created) {
  std::vector<SapoGroup> groups;
  std::map<std::string, size_t> index;
  for (const FinishedEpisode& ep : batch.episodes) {
    if (!ep.from_node.empty() || ep.exchange_calls.empty()) continue;
    SapoEpisode out;
    out.reward = ep.reward;
    bool ok = true;
    for (const std::string& record : ep.exchange_calls) {
      OJson call = OJson::parse(record, nullptr, /*allow_exceptions=*/false);
      if (!call.is_object()) {
        ok = false;
        break;
      }
      out.calls.push_back(std::move(call));
    }
    if (!ep.metadata_json.empty()) {
      OJson meta = OJson::parse(ep.metadata_json, nullptr, false);
      if (meta.is_object()) out.metadata = std::move(meta);
    }
    if (!ok) continue;
    auto [it, inserted] = index.emplace(ep.task_id, groups.size());
    if (inserted) {
      SapoGroup g;
      g.node_id = node_id;
      g.model = model;
      g.policy_step = policy_step;
      g.created = created;
      g.task_id = ep.task_id;
      if (!ep.task_metadata_json.empty()) {
        OJson tm = OJson::parse(ep.task_metadata_json, nullptr, false);
        if (tm.is_object()) g.task_metadata = std::move(tm);
      }
      groups.push_back(std::move(g));
    }
    groups[it->second].episodes.push_back(std::move(out));
  }
  return groups;
}

namespace {

std::string rstrip_whitespace(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.pop_back();
  return s;
}

// Contents as the server renders them (a string: null is "", parts are their texts joined).
void normalize_contents(OJson& messages) {
  for (auto& m : messages) {
    auto it = m.find("content");
    if (it != m.end() && it->is_string()) continue;
    std::string text;
    if (it != m.end() && it->is_array())
      for (const auto& part : *it) {
        if (part.is_string())
          text += part.get<std::string>();
        else if (part.is_object() && part.contains("text") && part["text"].is_string())
          text += part["text"].get<std::string>();
      }
    m["content"] = text;
  }
}

// One call in this node's tokens.
LlmCall reencode_call(const OJson& call, const Backend& backend, int64_t version) {
  LlmCall out;
  const std::string text = call.value("text", std::string());
  if (call.contains("messages")) {
    OJson messages = call["messages"];
    normalize_contents(messages);
    const OJson tools = call.contains("tools") && call["tools"].is_array() ? call["tools"] : OJson();
    OJson completion = call["completion"];
    // The reasoning field name differs between clients; templates read reasoning_content.
    if (completion.contains("reasoning") && !completion.contains("reasoning_content"))
      completion["reasoning_content"] = completion["reasoning"];
    completion.erase("reasoning");
    OJson full = messages;
    full.push_back(completion);
    normalize_contents(full);
    const OJson kwargs = OJson::object();
    const auto prompt_text =
        backend.render_chat_text(messages, tools, /*add_generation_prompt=*/true, kwargs);
    const auto full_text = backend.render_chat_text(full, tools, /*add_generation_prompt=*/false, kwargs);
    if (prompt_text && full_text && full_text->size() > prompt_text->size() &&
        full_text->compare(0, prompt_text->size(), *prompt_text) == 0) {
      // The answer as this node's template writes it after this prompt (its end-of-turn token
      // included; what the template adds after it is not generated).
      std::string answer = rstrip_whitespace(full_text->substr(prompt_text->size()));
      // A generation cut by max_tokens never wrote the end of its turn: neither does its copy.
      const auto& content = completion.contains("content") && completion["content"].is_string()
                                ? completion["content"].get_ref<const std::string&>()
                                : std::string();
      if (call.value("finish_reason", std::string()) == "length" && !content.empty()) {
        const auto at = answer.rfind(content);
        if (at != std::string::npos) answer.resize(at + content.size());
      }
      out.prompt_ids = backend.encode_rendered(*prompt_text);
      out.completion_ids = backend.encode_rendered(answer);
    } else {
      // A template that renders the history differently once an answer follows (or none that
      // renders as text): the prompt rendered, the sender's generated text as it was.
      out.prompt_ids = backend.render_chat(messages, tools, /*add_generation_prompt=*/true);
      out.completion_ids = backend.encode_rendered(text);
    }
  } else {
    out.prompt_ids = backend.encode_rendered(call.value("prompt", std::string()));
    out.completion_ids = backend.encode_rendered(text);
  }
  out.completion_logprobs.assign(out.completion_ids.size(), std::numeric_limits<float>::quiet_NaN());
  out.policy_version = version;
  out.finish_reason = call.value("finish_reason", std::string("stop"));
  // The sender's sampling temperature (checked by parse_sapo_group); without one the tokens are
  // trained as an on-policy recomputation at temperature 1 (their log-probs are unknown: NaN).
  if (auto t = call.find("temperature"); t != call.end() && t->is_number())
    out.temperature = static_cast<float>(t->get<double>());
  return out;
}

}  // namespace

std::vector<FinishedEpisode> reencode_sapo_group(const SapoGroup& group, const Backend& backend,
                                                 int64_t version, int64_t max_context) {
  std::vector<FinishedEpisode> out;
  const std::string task_id = "sapo/" + group.node_id + "/" + group.task_id;
  for (size_t e = 0; e < group.episodes.size(); ++e) {
    const SapoEpisode& episode = group.episodes[e];
    std::vector<LlmCall> calls;
    for (const auto& call : episode.calls) {
      LlmCall c = reencode_call(call, backend, version);
      const auto length = static_cast<int64_t>(c.prompt_ids.size() + c.completion_ids.size());
      SWARM_REQUIRE(length <= max_context, ErrorKind::INVALID_ARGUMENT,
                    "a call of " + std::to_string(length) + " tokens does not fit the context (" +
                        std::to_string(max_context) + ")");
      SWARM_REQUIRE(!c.completion_ids.empty(), ErrorKind::INVALID_ARGUMENT,
                    "a call with an empty completion");
      calls.push_back(std::move(c));
    }
    FinishedEpisode ep;
    ep.episode_uuid = "sapo-" + group.node_id + "-" + std::to_string(group.policy_step) + "-" +
                      std::to_string(std::hash<std::string>{}(group.task_id) & 0xffffffffu) + "-" +
                      std::to_string(e);
    ep.client_uuid = "swarm:" + group.node_id;
    ep.task_id = task_id;
    ep.reward = episode.reward;
    ep.samples = merge_calls_into_samples(calls);
    for (Sample& s : ep.samples) {
      s.task_id = task_id;
      s.episode_uuid = ep.episode_uuid;
      s.reward = ep.reward;
    }
    ep.min_version = version;
    ep.from_node = group.node_id;
    out.push_back(std::move(ep));
  }
  return out;
}

namespace {

// The job's node id, else the one kept in `file`, else a new random one (kept there).
std::string node_id_of(const Job& job, const std::filesystem::path& file) {
  if (!job.node_id.empty()) return job.node_id;
  std::string id;
  if (!file.empty()) {
    std::ifstream in(file);
    std::getline(in, id);
  }
  if (valid_swarm_token(id)) return id;
  std::random_device rd;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%08x%08x", rd(), rd());
  id = std::string("node-") + hex;
  if (!file.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    std::ofstream(file) << id << '\n';
  }
  return id;
}

}  // namespace

ExperienceSharing::ExperienceSharing(const Job& job, const std::string& model,
                                     const std::filesystem::path& node_id_file, uint64_t seed)
    : publish_(job.exchange_publish), external_groups_(job.sapo_external_groups), rng_(seed) {
  ExchangeConfig c = exchange_config_from(job, node_id_of(job, node_id_file));
  spdlog::info(
      "engine: swarm '{}' as node {} of model {} via {} (publish {}, consume {}, {} external group(s) per "
      "step)",
      c.swarm_name, c.node_id, model, redact_url(c.url), c.publish, c.consume, external_groups_);
  exchange_ = std::make_shared<Exchange>(std::move(c));
}

std::map<std::string, double> ExperienceSharing::share(const Backend& backend, TrainBatch& batch,
                                                       int64_t policy_step) {
  Exchange& exchange = *exchange_;
  std::map<std::string, double> m;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  int64_t local_episodes = 0;
  double local_reward = 0.0;
  for (const FinishedEpisode& e : batch.episodes) {
    ++local_episodes;
    local_reward += e.reward;
  }
  if (publish_)
    for (const SapoGroup& g :
         sapo_groups_of_batch(batch, exchange.config().node_id, backend.model_id(), policy_step, now))
      exchange.publish(g);
  int64_t used = 0, episodes = 0;
  if (external_groups_ > 0) {
    for (const SapoGroup& g : exchange.draw(static_cast<size_t>(external_groups_), rng_)) {
      try {
        std::vector<FinishedEpisode> eps =
            reencode_sapo_group(g, backend, policy_step, backend.max_context_length());
        episodes += static_cast<int64_t>(eps.size());
        for (FinishedEpisode& e : eps) batch.episodes.push_back(std::move(e));
        ++batch.num_tasks;
        ++used;
      } catch (const std::exception& e) {
        spdlog::warn("engine: an external group from {} (task '{}') could not be re-encoded: {}", g.node_id,
                     g.task_id, e.what());
        exchange.note_unusable(g, SapoDrop::REENCODE);
      }
    }
    if (used < external_groups_)
      spdlog::info("engine: step {} trains on {} of {} external group(s) (the buffer held no more)",
                   policy_step + 1, used, external_groups_);
  }
  const ExchangeStatus st = exchange.status();
  m["external_groups"] = static_cast<double>(used);
  m["external_episodes"] = static_cast<double>(episodes);
  m["local_episodes"] = static_cast<double>(local_episodes);
  if (local_episodes > 0) m["local_reward_mean"] = local_reward / static_cast<double>(local_episodes);
  m["exchange_published"] = static_cast<double>(st.published);
  m["exchange_received"] = static_cast<double>(st.received);
  m["exchange_accepted"] = static_cast<double>(st.accepted);
  m["exchange_buffered"] = static_cast<double>(st.buffered);
  m["exchange_outbox"] = static_cast<double>(st.outbox);
  m["exchange_connected"] = st.connected ? 1.0 : 0.0;
  int64_t dropped = 0;
  for (const auto& [reason, n] : st.dropped)
    if (reason != "own") dropped += n;
  m["exchange_dropped"] = static_cast<double>(dropped);
  return m;
}

}  // namespace swarm
