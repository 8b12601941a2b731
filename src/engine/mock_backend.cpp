#include "engine/mock_backend.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/random.hpp"
#include "common/utf8.hpp"
#include "grammar/grammar.hpp"
#include "inference/block_allocator.hpp"
#include "swarm/job.hpp"

namespace swarm {
namespace {

// SplitMix64: tiny, fast, good enough for deterministic fake sampling.
struct Rng {
  uint64_t state;
  uint64_t next() { return splitmix64(state); }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
};

uint64_t hash_ids(const std::vector<TokenId>& ids, uint64_t h) {
  for (TokenId id : ids) h = (h ^ static_cast<uint64_t>(id)) * 0x100000001B3ull;
  return h;
}

// Constrained decoding on the mock: a random sentence of the grammar, byte by byte (closing
// bytes favoured so that it ends; a TOKEN element gives that id), at most `max_new` ids.
std::vector<TokenId> grammar_walk(const grammar::Grammar& g, Rng& rng, int64_t max_new) {
  grammar::Matcher m(g);
  std::vector<TokenId> ids;
  while (static_cast<int64_t>(ids.size()) < max_new) {
    const auto tokens = m.allowed_special_tokens(m.state());
    std::vector<uint8_t> bytes;
    std::vector<double> weight;
    double total = 0;
    for (int b = 0; b < 256; ++b)
      if (!m.advance(m.state(), static_cast<uint8_t>(b)).empty()) {
        bytes.push_back(static_cast<uint8_t>(b));
        weight.push_back(
            std::string_view("\"}],").find(static_cast<char>(b)) != std::string_view::npos ? 30.0 : 1.0);
        total += weight.back();
      }
    if (m.accepting() && ((bytes.empty() && tokens.empty()) || rng.uniform() < 0.3)) break;
    if (!tokens.empty() && (bytes.empty() || rng.uniform() < 0.5)) {
      const uint32_t t = tokens[rng.next() % tokens.size()];
      m.feed_token(t);
      ids.push_back(static_cast<TokenId>(t));
      continue;
    }
    if (bytes.empty()) break;
    double u = rng.uniform() * total;
    size_t k = 0;
    while (k + 1 < bytes.size() && u >= weight[k]) u -= weight[k++];
    m.feed_byte(bytes[k]);
    ids.push_back(static_cast<TokenId>(bytes[k]));
  }
  return ids;
}

// Interruptible sleep; returns false if stop was requested.
bool sleep_for(double seconds, const std::stop_token& stop) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (stop.stop_requested()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return !stop.stop_requested();
}

void append_text(std::vector<TokenId>& ids, std::string_view text) {
  for (unsigned char c : text) ids.push_back(static_cast<TokenId>(c));
}

std::string content_text(const nlohmann::ordered_json& content, size_t index) {
  if (content.is_null()) return "";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string out;
    for (const auto& part : content) {
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
        throw SwarmError(ErrorKind::INVALID_ARGUMENT, "messages[" + std::to_string(index) +
                                                          "].content parts must be objects with a 'type'");
      if (part["type"] == "text") {
        if (!part.contains("text") || !part["text"].is_string())
          throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                           "messages[" + std::to_string(index) + "].content text part needs a string 'text'");
        out += part["text"].get<std::string>();
      } else {
        throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                         "messages[" + std::to_string(index) + "].content part type '" +
                             part["type"].get<std::string>() + "' is not supported");
      }
    }
    return out;
  }
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "messages[" + std::to_string(index) +
                                                    "].content must be a string, an array of parts, or null");
}

// The last user turn (chat prompts) or the last line of a plain prompt.
// The text of the last user or tool message: an agent scripts a tool call by sending
// `<tool_call>{...}</tool_call>` as its user message, and the tool's result comes back as the
// final answer (a two-turn tool loop).
std::string echo_source(const std::vector<TokenId>& prompt) {
  for (size_t i = prompt.size(); i-- > 0;) {
    if (prompt[i] != MockBackend::kImStart) continue;
    for (const std::string role : {"user\n", "tool\n"}) {
      size_t j = i + 1;
      bool match = j + role.size() <= prompt.size();
      for (size_t k = 0; match && k < role.size(); ++k)
        match = prompt[j + k] == static_cast<unsigned char>(role[k]);
      if (!match) continue;
      std::string out;
      for (size_t k = j + role.size(); k < prompt.size() && prompt[k] != MockBackend::kImEnd; ++k)
        if (prompt[k] < 256) out += static_cast<char>(prompt[k]);
      return out;
    }
  }
  std::string text;
  for (TokenId id : prompt)
    if (id < 256) text += static_cast<char>(id);
  size_t nl = text.find_last_of('\n', text.size() > 1 ? text.size() - 2 : 0);
  if (nl != std::string::npos && nl + 1 < text.size()) text = text.substr(nl + 1);
  if (text.size() > 256) text = text.substr(text.size() - 256);
  return text;
}

bool prompt_is_chat(const std::vector<TokenId>& prompt) {
  for (TokenId id : prompt)
    if (id == MockBackend::kImStart) return true;
  return false;
}

}  // namespace

double MockBackend::corruption_rate(int64_t policy_version, double temperature) {
  if (temperature <= 0) return 0.0;
  double base = 0.6 * std::min(1.0, temperature);
  return base * std::pow(0.7, static_cast<double>(std::max<int64_t>(0, policy_version)));
}

MockBackend::MockBackend() = default;
MockBackend::~MockBackend() = default;

void MockBackend::boot(const Job& job, std::stop_token stop) {
  if (!sleep_for(job.mock_boot_seconds, stop)) throw SwarmError(ErrorKind::CONFLICT, "boot cancelled");
  model_id_ = job.model;
  max_context_ = job.max_prompt_length + job.max_response_length;
  train_seconds_ = job.mock_train_seconds;
  policy_version_ = 0;
  {
    std::lock_guard lk(kv_mu_);
    kv_.reset();
    if (job.prefix_caching) {
      // The torch engine's automatic size would be model-dependent: 64 full contexts here.
      const int64_t tokens = job.kv_cache_tokens > 0 ? job.kv_cache_tokens : 64 * max_context_;
      kv_ = std::make_unique<BlockAllocator>((tokens + job.kv_block_size - 1) / job.kv_block_size,
                                             job.kv_block_size);
    }
    kv_version_ = 0;
    kv_queries_ = kv_hits_ = 0;
  }
  if (!resume_checkpoint_.empty())
    SWARM_REQUIRE(
        std::filesystem::exists(resume_checkpoint_ / "mock_checkpoint.json"), ErrorKind::INVALID_ARGUMENT,
        "'" + resume_checkpoint_.string() + "' was not written by the mock engine (no mock_checkpoint.json)");
}

// One sequence through the prefix cache as the torch engine runs it: the cached full blocks of
// its prompt reused (at least one token computed), the rest taken, every full block of what it
// fed (prompt and all but the last generated id) published, then released.
void MockBackend::simulate_prefix_cache(const std::vector<TokenId>& prompt,
                                        const std::vector<TokenId>& generated, int64_t version) {
  std::lock_guard lk(kv_mu_);
  if (!kv_) return;
  if (version != kv_version_) {
    kv_->drop_cached();
    kv_version_ = version;
  }
  std::vector<int32_t> fed(prompt.begin(), prompt.end());
  if (!generated.empty()) fed.insert(fed.end(), generated.begin(), generated.end() - 1);
  const int64_t bs = kv_->block_size();
  const uint64_t root = kv_chain_root(version);
  std::vector<uint64_t> hashes;
  for (int64_t i = 0; (i + 1) * bs <= static_cast<int64_t>(fed.size()); ++i)
    hashes.push_back(kv_block_hash(i == 0 ? root : hashes.back(), fed.data() + i * bs, bs));
  const int64_t len = static_cast<int64_t>(prompt.size());
  const std::vector<int64_t> hit = kv_->match(root, hashes, fed.data(), len > 0 ? (len - 1) / bs : 0);
  kv_queries_ += len;
  kv_hits_ += static_cast<int64_t>(hit.size()) * bs;
  const int64_t slot = kv_next_slot_++;
  if (!kv_->attach(slot, hit, static_cast<int64_t>(fed.size()) + 1)) return;  // larger than the pool
  for (size_t i = hit.size(); i < hashes.size(); ++i)
    kv_->publish(slot, static_cast<int64_t>(i), hashes[i], i == 0 ? root : hashes[i - 1],
                 fed.data() + static_cast<int64_t>(i) * bs);
  kv_->release(slot);
}

std::map<std::string, double> MockBackend::inference_metrics() const {
  std::lock_guard lk(kv_mu_);
  if (!kv_) return {};
  return {{"kv_blocks_total", double(kv_->num_blocks())},
          {"kv_blocks_free", double(kv_->free_blocks())},
          {"kv_blocks_cached", double(kv_->cached_blocks())},
          {"prefix_cache_queries_tokens_total", double(kv_queries_)},
          {"prefix_cache_hit_tokens_total", double(kv_hits_)}};
}

void MockBackend::save_checkpoint(const std::filesystem::path& dir) {
  // No weights: a marker that says which engine wrote it (the engine adds its own state).
  std::ofstream out(dir / "mock_checkpoint.json", std::ios::binary | std::ios::trunc);
  out << nlohmann::json{{"backend", "mock"}, {"model", model_id_}, {"policy_version", policy_version_.load()}}
             .dump()
      << '\n';
  out.flush();
  SWARM_REQUIRE(out.good(), ErrorKind::INTERNAL, "cannot write " + (dir / "mock_checkpoint.json").string());
}

std::vector<TokenId> MockBackend::render_chat(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& tools,
                                              bool add_generation_prompt) const {
  return encode_rendered(
      *render_chat_text(messages, tools, add_generation_prompt, nlohmann::ordered_json::object()));
}

std::optional<std::string> MockBackend::render_chat_text(const nlohmann::ordered_json& messages,
                                                         const nlohmann::ordered_json& tools,
                                                         bool add_generation_prompt,
                                                         const nlohmann::ordered_json&) const {
  if (!messages.is_array() || messages.empty())
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "'messages' must be a non-empty array");
  const auto dump = [](const nlohmann::ordered_json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  std::string out;
  if (tools.is_array() && !tools.empty())
    out += "<|im_start|>system\n# Tools\n" + dump(tools) + "<|im_end|>\n";
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object())
      throw SwarmError(ErrorKind::INVALID_ARGUMENT, "messages[" + std::to_string(i) + "] must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                       "messages[" + std::to_string(i) + "].role must be a string");
    const std::string role = m["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                       "messages[" + std::to_string(i) + "].role '" + role +
                           "' is not one of system, user, assistant, tool, developer");
    std::string text = content_text(m.contains("content") ? m["content"] : nlohmann::ordered_json(), i);
    if (m.contains("tool_calls") && m["tool_calls"].is_array())
      for (const auto& call : m["tool_calls"]) text += "<tool_call>" + dump(call) + "</tool_call>";
    out += "<|im_start|>" + role + "\n" + text + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::vector<TokenId> MockBackend::encode_rendered(const std::string& text) const {
  static const std::pair<std::string_view, TokenId> kSpecial[] = {
      {"<|im_start|>", kImStart}, {"<|im_end|>", kImEnd}, {"<|endoftext|>", kEndOfText}};
  std::vector<TokenId> ids;
  for (size_t i = 0; i < text.size();) {
    bool special = false;
    for (const auto& [s, id] : kSpecial)
      if (text.compare(i, s.size(), s) == 0) {
        ids.push_back(id);
        i += s.size();
        special = true;
        break;
      }
    if (!special) ids.push_back(static_cast<TokenId>(static_cast<unsigned char>(text[i++])));
  }
  return ids;
}

std::vector<TokenId> MockBackend::encode(const std::string& text) const {
  std::vector<TokenId> ids;
  append_text(ids, text);
  return ids;
}

std::string MockBackend::decode(const std::vector<TokenId>& ids) const {
  std::string out;
  for (TokenId id : ids)
    if (id >= 0 && id < 256) out += static_cast<char>(id);
  return out;
}

std::string MockBackend::token_text(TokenId id) const {
  switch (id) {
    case kEndOfText:
      return "<|endoftext|>";
    case kImStart:
      return "<|im_start|>";
    case kImEnd:
      return "<|im_end|>";
    default:
      return id >= 0 && id < 256 ? std::string(1, static_cast<char>(id)) : std::string();
  }
}

void MockBackend::generate(GenerationRequest request, std::shared_ptr<GenerationObserver> observer) {
  try {
    const auto& p = request.params;
    const int64_t prompt_len = static_cast<int64_t>(request.prompt_ids.size());
    if (prompt_len >= max_context_) {
      observer->on_error(ErrorKind::INVALID_ARGUMENT, "prompt is " + std::to_string(prompt_len) +
                                                          " tokens; the context length is " +
                                                          std::to_string(max_context_));
      return;
    }
    const int64_t max_new = std::min<int64_t>(p.max_tokens, max_context_ - prompt_len);
    const std::string source = echo_source(request.prompt_ids);
    const TokenId stop_token = prompt_is_chat(request.prompt_ids) ? kImEnd : kEndOfText;
    const int64_t version = policy_version_.load();
    const double rate = corruption_rate(version, p.temperature);

    GenerationResult result;
    result.policy_version = version;
    for (int64_t c = 0; c < p.n; ++c) {
      Rng rng{hash_ids(request.prompt_ids, 0xcbf29ce484222325ull ^ (p.seed.value_or(0) * 31 + c) ^
                                               (static_cast<uint64_t>(version) << 40))};
      std::string reply = source.empty() ? std::string("ok") : source;
      for (char& ch : reply)
        if (((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) && rng.uniform() < rate)
          ch = static_cast<char>('a' + rng.next() % 26);
      std::vector<TokenId> constrained;
      if (request.grammar) {  // a random sentence of the grammar instead of the echo
        constrained = grammar_walk(*request.grammar, rng, max_new);
        reply = decode(constrained);
      }

      GenerationChoice choice;
      choice.finish_reason = "stop";
      bool cut_by_stop_string = false;
      std::string matched;  // as the torch engine: the ids hold the stop string, the text does not
      for (const auto& s : p.stop) {
        size_t pos = s.empty() ? std::string::npos : reply.find(s);
        if (pos != std::string::npos) {
          reply.resize(pos);
          matched = s;
          cut_by_stop_string = true;
        }
      }
      const size_t text_ids = reply.size();  // ids past these are the stop string: never streamed
      if (request.grammar && !cut_by_stop_string)
        choice.ids = constrained;
      else
        append_text(choice.ids, reply + matched);
      if (!cut_by_stop_string) choice.ids.push_back(stop_token);
      if (static_cast<int64_t>(choice.ids.size()) > max_new) {
        choice.ids.resize(static_cast<size_t>(max_new));
        choice.finish_reason = "length";
      }
      std::string pending;
      for (size_t k = 0; k < choice.ids.size(); ++k) {
        const TokenId id = choice.ids[k];
        // Greedy (temperature 0) picks are confident; sampled ones less so.
        float lp = static_cast<float>(-(p.temperature <= 0 ? 0.05 : 2.5) * rng.uniform()) - 0.001f;
        choice.logprobs.push_back(lp);
        if (p.logprobs && p.top_logprobs > 0) {
          std::vector<TokenAlternative> alts{{id, lp}};
          for (int64_t k = 1; k < p.top_logprobs; ++k)
            alts.push_back({static_cast<TokenId>(rng.next() % 256), lp - 0.5f - static_cast<float>(k)});
          choice.top.push_back(std::move(alts));
        }
        if (id < 256 && (!cut_by_stop_string || k < text_ids)) {
          pending += static_cast<char>(id);
          size_t ready = utf8_complete_prefix(pending);
          if (ready > 0) {
            observer->on_text(c, pending.substr(0, ready));
            pending.erase(0, ready);
          }
        }
      }
      if (!pending.empty()) observer->on_text(c, utf8_sanitize(pending));
      choice.versions.assign(choice.ids.size(), version);
      choice.text = utf8_sanitize(decode(choice.ids));
      if (cut_by_stop_string && choice.text.size() >= matched.size() && choice.finish_reason == "stop")
        choice.text.resize(choice.text.size() - matched.size());
      simulate_prefix_cache(request.prompt_ids, choice.ids, version);
      result.choices.push_back(std::move(choice));
    }
    observer->on_complete(std::move(result));
  } catch (const SwarmError& e) {
    observer->on_error(e.kind(), e.what());
  } catch (const std::exception& e) {
    observer->on_error(ErrorKind::INTERNAL, e.what());
  }
}

TrainStepReport MockBackend::train_step(const TrainBatch& batch, int64_t next_global_step,
                                        std::stop_token stop) {
  auto start = std::chrono::steady_clock::now();
  if (!sleep_for(train_seconds_, stop)) throw SwarmError(ErrorKind::CONFLICT, "training step cancelled");
  // The simulated weight swap: generations from now on are stamped with the new version.
  notify_swap(true);
  policy_version_ = next_global_step;
  notify_swap(false);
  TrainStepReport report = summarize_batch(batch);
  report.global_step = next_global_step;
  // What a GRPO update would train (no weights here): the sequences of task groups whose
  // rewards differ, reported under the trainer's metric names.
  std::map<std::string, std::vector<const FinishedEpisode*>> groups;
  for (const FinishedEpisode& e : batch.episodes) groups[e.task_id].push_back(&e);
  int64_t equal = 0, trained = 0;
  for (const auto& [task, members] : groups) {
    const bool all_equal = std::all_of(members.begin(), members.end(), [&](const FinishedEpisode* e) {
      return e->reward == members.front()->reward;
    });
    if (all_equal) {
      ++equal;
      continue;
    }
    for (const FinishedEpisode* e : members) trained += static_cast<int64_t>(e->samples.size());
  }
  report.metrics["groups"] = static_cast<double>(groups.size());
  report.metrics["groups_zero_variance"] = static_cast<double>(equal);
  report.metrics["sequences_trained"] = static_cast<double>(trained);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace swarm
