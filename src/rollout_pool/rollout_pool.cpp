#include "rollout_pool/rollout_pool.hpp"

#include <future>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <utility>

#include "common/error.hpp"
#include "rollout_pool/context_tracker.hpp"

namespace swarm {

namespace {

constexpr double kRewardEpsilon = 1e-9;
constexpr size_t kApiKeyRandomBytes = 24;  // 48 hex chars, 192 bits

// The episode end, abort and can_continue may act on: claimed (an unclaimed slot's uuid was
// never handed out) and not ending (that one is already done); nullptr otherwise.
template <typename EpisodeMap>
auto* running_episode(const EpisodeMap& episodes, const std::string& uuid) {
  auto it = episodes.find(uuid);
  return it != episodes.end() && it->second->claimed && !it->second->ending ? it->second.get() : nullptr;
}

struct RewardStats {
  double mean = 0.0;
  double std = 0.0;  // population std
  bool all_equal = true;
};

template <class Episodes>
RewardStats reward_stats(const Episodes& episodes) {
  RewardStats s;
  if (episodes.empty()) return s;
  double lo = episodes.front().reward, hi = lo, sum = 0.0;
  for (const auto& e : episodes) {
    lo = std::min(lo, e.reward);
    hi = std::max(hi, e.reward);
    sum += e.reward;
  }
  const double n = static_cast<double>(episodes.size());
  s.mean = sum / n;
  double var = 0.0;
  for (const auto& e : episodes) var += (e.reward - s.mean) * (e.reward - s.mean);
  s.std = std::sqrt(var / n);
  s.all_equal = hi - lo <= kRewardEpsilon;
  return s;
}

std::string not_found_message(const std::string& episode_uuid) {
  return "episode " + episode_uuid + " not found (it may have ended, been aborted, or timed out)";
}

void require_positive(int64_t value, const char* name) {
  SWARM_REQUIRE(value > 0, ErrorKind::INVALID_ARGUMENT,
                std::string("pool config: ") + name + " must be positive, got " + std::to_string(value));
}

}  // namespace

RolloutPool::RolloutPool(PoolConfig config, std::shared_ptr<Clock> clock)
    : config_(config), clock_(std::move(clock)) {
  SWARM_CHECK(clock_ != nullptr, "RolloutPool needs a clock");
  require_positive(config_.max_parallel_episodes, "max_parallel_episodes");
  require_positive(config_.batch_size, "batch_size");
  require_positive(config_.num_repeat, "num_repeat");
  require_positive(config_.max_cached_episodes, "max_cached_episodes");
  require_positive(config_.max_llm_calls_per_episode, "max_llm_calls_per_episode");
}

void RolloutPool::set_accepting_claims(bool accepting) {
  std::lock_guard lock(mu_);
  accepting_ = accepting;
  if (accepting) {
    register_slots_locked();
    return;
  }
  for (const std::string& uuid : unclaimed_) episodes_.erase(uuid);
  unclaimed_.clear();
}

ClaimResult RolloutPool::claim(const ClaimRequest& request) {
  SWARM_REQUIRE(!request.client_uuid.empty(), ErrorKind::INVALID_ARGUMENT,
                "claim: client_uuid must not be empty");
  SWARM_REQUIRE(std::isfinite(request.discard_episode_timeout) && request.discard_episode_timeout > 0.0,
                ErrorKind::INVALID_ARGUMENT,
                "claim: discard_episode_timeout must be a positive number of seconds, got " +
                    std::to_string(request.discard_episode_timeout));
  // Bounded: an idle episode holds a slot and its context until the timeout reaps it.
  SWARM_REQUIRE(request.discard_episode_timeout <= kMaxDiscardEpisodeTimeout, ErrorKind::INVALID_ARGUMENT,
                "claim: discard_episode_timeout must be at most " +
                    std::to_string(int64_t(kMaxDiscardEpisodeTimeout)) + " seconds (24 h), got " +
                    std::to_string(request.discard_episode_timeout));
  // Generated before taking the lock: reading the OS CSPRNG is a syscall.
  std::string api_key = "sk-swarm-" + random_hex(kApiKeyRandomBytes);

  std::lock_guard lock(mu_);
  ClaimResult result;
  if (!accepting_) {
    // The wording AgentJet's client retries on (15 s), as in the engine's own refusals.
    result.fail_cause =
        "Engine is in post-rolling phase: not accepting new episodes (the batch is complete; waiting for "
        "weight "
        "sync). Try again later.";
    return result;
  }
  if (request.episode_type == EpisodeType::TRAIN && train_admission_limit_ >= 0) {
    int64_t running_train = 0;
    for (const auto& [id, ep] : episodes_)
      running_train += ep->claimed && ep->type == EpisodeType::TRAIN ? 1 : 0;
    const bool could_progress = batch_ready_locked() || running_train > 0;
    if (running_train + finished_cached_ >= train_admission_limit_ && could_progress) {
      counters_.claims_held_by_staleness++;
      result.fail_cause =
          "No available episodes to claim. The staleness bound (max_staleness) holds new episodes "
          "until the trainer has caught up (" +
          std::to_string(running_train + finished_cached_) + " train episodes running or waiting, bound " +
          std::to_string(train_admission_limit_) + "); try again later.";
      return result;
    }
  }
  if (config_.max_claimed_per_client > 0) {
    int64_t held = 0;
    for (const auto& [id, ep] : episodes_)
      held += ep->claimed && ep->client_uuid == request.client_uuid ? 1 : 0;
    if (held >= config_.max_claimed_per_client) {
      result.fail_cause = "Client " + request.client_uuid + " holds " + std::to_string(held) +
                          " unfinished episodes, the most one client may (max_claimed_per_client " +
                          std::to_string(config_.max_claimed_per_client) +
                          "): end or abort one before claiming another.";
      return result;
    }
  }
  if (unclaimed_.empty()) {
    // "No available episodes to claim." is what AgentJet's client retries on quickly (2 s).
    result.fail_cause = "No available episodes to claim. All " +
                        std::to_string(config_.max_parallel_episodes) + " slots are in use; try again later.";
    return result;
  }
  std::string uuid = std::move(unclaimed_.front());
  unclaimed_.pop_front();
  Episode& ep = *episodes_.at(uuid);
  const TimePoint now = clock_->now();
  ep.claimed = true;
  ep.client_uuid = request.client_uuid;
  ep.type = request.episode_type;
  ep.api_key = api_key;
  ep.timeout_s = request.discard_episode_timeout;
  ep.optional_task_id = request.optional_task_id;
  ep.claimed_at = now;
  ep.last_activity = now;
  ep.claim_seq = ++claim_seq_;
  key_to_episode_[api_key] = uuid;
  counters_.claimed++;
  refresh_active_client_locked(request.client_uuid);
  result.episode = ClaimedEpisode{std::move(uuid), std::move(api_key)};
  return result;
}

CallTicket RolloutPool::begin_call(const std::string& api_key) {
  std::lock_guard lock(mu_);
  auto key_it = key_to_episode_.find(api_key);
  // Never echo the key or hint at which keys exist.
  SWARM_REQUIRE(key_it != key_to_episode_.end(), ErrorKind::UNAUTHORIZED,
                "invalid API key (unknown, or its episode has ended, been aborted, or "
                "timed out)");
  Episode& ep = *episodes_.at(key_it->second);
  ep.last_activity = clock_->now();
  refresh_active_client_locked(ep.client_uuid);
  // Calls in flight count against the budget so concurrent requests cannot overshoot it.
  const int64_t used = static_cast<int64_t>(ep.calls.size()) + ep.in_flight;
  SWARM_REQUIRE(used < config_.max_llm_calls_per_episode, ErrorKind::CONFLICT,
                "episode " + ep.uuid + " has used its budget of " +
                    std::to_string(config_.max_llm_calls_per_episode) +
                    " LLM calls (max_llm_calls_per_episode); end the episode");
  ep.in_flight++;
  return CallTicket{ep.uuid, ep.client_uuid, ep.type};
}

bool RolloutPool::finish_call(const std::string& episode_uuid, LlmCall call) {
  std::lock_guard lock(mu_);
  auto it = episodes_.find(episode_uuid);
  if (it == episodes_.end() || !it->second->claimed || it->second->ending) {
    counters_.late_calls_dropped++;
    return false;
  }
  Episode& ep = *it->second;
  ep.in_flight = std::max<int64_t>(0, ep.in_flight - 1);
  ep.last_activity = clock_->now();
  // The call has ended either way (in_flight released above); a mismatch is an engine bug.
  SWARM_CHECK(call.completion_logprobs.size() == call.completion_ids.size(),
              "episode " + episode_uuid + ": " + std::to_string(call.completion_logprobs.size()) +
                  " logprobs for " + std::to_string(call.completion_ids.size()) + " completion tokens");
  ep.calls.push_back(std::move(call));
  counters_.llm_calls++;
  return true;
}

std::optional<std::vector<TokenId>> RolloutPool::turn_ids(const std::string& episode_uuid,
                                                          const std::string& turn_key) const {
  if (turn_key.empty()) return std::nullopt;
  std::lock_guard lock(mu_);
  auto it = episodes_.find(episode_uuid);
  if (it == episodes_.end()) return std::nullopt;
  const auto& calls = it->second->calls;
  for (auto c = calls.rbegin(); c != calls.rend(); ++c) {
    if (c->turn_key != turn_key) continue;
    std::vector<TokenId> ids;
    ids.reserve(c->prompt_ids.size() + c->completion_ids.size());
    ids.insert(ids.end(), c->prompt_ids.begin(), c->prompt_ids.end());
    ids.insert(ids.end(), c->completion_ids.begin(), c->completion_ids.end());
    return ids;
  }
  return std::nullopt;
}

void RolloutPool::cancel_call(const std::string& episode_uuid) {
  std::lock_guard lock(mu_);
  auto it = episodes_.find(episode_uuid);
  if (it == episodes_.end()) return;
  Episode& ep = *it->second;
  ep.in_flight = std::max<int64_t>(0, ep.in_flight - 1);
  ep.last_activity = clock_->now();
}

void RolloutPool::touch(const std::string& episode_uuid) {
  std::lock_guard lock(mu_);
  auto it = episodes_.find(episode_uuid);
  if (it != episodes_.end() && it->second->claimed) it->second->last_activity = clock_->now();
}

EndOutcome RolloutPool::end_episode(const std::string& client_uuid, const std::string& episode_uuid,
                                    const std::string& task_id, const WorkflowOutput& output,
                                    bool declare_client_active) {
  return wait_for_end([&](EndDone done) {
    end_episode_async(client_uuid, episode_uuid, task_id, output, declare_client_active, std::move(done));
  });
}

EndOutcome RolloutPool::wait_for_end(const std::function<void(EndDone)>& start) {
  std::promise<EndOutcome> p;
  std::future<EndOutcome> f = p.get_future();
  start([&p](EndOutcome o, std::exception_ptr e) {
    if (e)
      p.set_exception(e);
    else
      p.set_value(std::move(o));
  });
  return f.get();
}

void RolloutPool::end_episode_async(const std::string& client_uuid, const std::string& episode_uuid,
                                    const std::string& task_id, const WorkflowOutput& output,
                                    bool declare_client_active, EndDone done) {
  std::vector<LlmCall> calls;
  std::string optional_task_id;
  std::optional<EndOutcome> early;  // eval episodes and null rewards: answered without a record
  bool waiting = false;             // a retry of an end in progress: answered when it completes
  [&] {
    std::lock_guard lock(mu_);
    // A retry (the first answer was lost): the recorded outcome, or the one in progress.
    if (auto it = episodes_.find(episode_uuid);
        it != episodes_.end() && it->second->claimed && it->second->ending) {
      Episode& ending = *it->second;
      SWARM_REQUIRE(ending.client_uuid == client_uuid, ErrorKind::FORBIDDEN,
                    "episode " + episode_uuid + " belongs to another client");
      SWARM_REQUIRE(ending.end_waiters.size() < kMaxEndWaiters, ErrorKind::CONFLICT,
                    "end_episode: episode " + episode_uuid + " is already being ended and " +
                        std::to_string(kMaxEndWaiters) + " retries wait for it; retry once it has ended");
      counters_.end_replayed++;
      ending.end_waiters.push_back(std::move(done));
      waiting = true;
      return;
    }
    if (!running_episode(episodes_, episode_uuid)) {
      if (auto it = remembered_ends_.find(episode_uuid); it != remembered_ends_.end()) {
        SWARM_REQUIRE(it->second.client_uuid == client_uuid, ErrorKind::FORBIDDEN,
                      "episode " + episode_uuid + " belongs to another client");
        counters_.end_replayed++;
        early = it->second.outcome;
        return;
      }
    }
    Episode& ep = owned_episode_locked(client_uuid, episode_uuid);
    SWARM_REQUIRE(!task_id.empty(), ErrorKind::INVALID_ARGUMENT,
                  "end_episode: task_id must not be empty (episode " + episode_uuid + ")");
    SWARM_REQUIRE(!output.reward || std::isfinite(*output.reward), ErrorKind::INVALID_ARGUMENT,
                  "end_episode: reward must be a finite number (episode " + episode_uuid + ")");
    EndOutcome outcome;
    if (ep.type == EpisodeType::EVAL) {
      record_eval_locked(output);
      counters_.ended++;
      counters_.ended_eval++;
      if (!output.reward) {
        outcome.note =
            "eval episode " + episode_uuid + " ended without a reward; it is not part of eval/reward_mean";
      }
      free_slot_locked(episode_uuid, true);
      outcome.batch_ready = batch_ready_locked();
      remember_end_locked(episode_uuid, client_uuid, outcome);
      early = std::move(outcome);
      return;
    }
    if (declare_client_active) register_active_client_locked(client_uuid);
    // Finer rewards must match the calls the episode made (before anything is changed).
    const size_t made = ep.calls.size();
    const bool turns_match = output.turn_rewards.size() == made;
    SWARM_REQUIRE(output.turn_rewards.empty() || turns_match || output.turn_rewards_from_list,
                  ErrorKind::INVALID_ARGUMENT,
                  "end_episode: workflow_output.turn_rewards has " +
                      std::to_string(output.turn_rewards.size()) + " numbers but episode " + episode_uuid +
                      " made " + std::to_string(made) + " LLM calls (one per call, in call order)");
    SWARM_REQUIRE(
        output.token_rewards.empty() || output.token_rewards.size() == made, ErrorKind::INVALID_ARGUMENT,
        "end_episode: workflow_output.token_rewards has " + std::to_string(output.token_rewards.size()) +
            " lists but episode " + episode_uuid + " made " + std::to_string(made) + " LLM calls");
    for (size_t c = 0; c < output.token_rewards.size(); ++c)
      SWARM_REQUIRE(
          output.token_rewards[c].size() == ep.calls[c].completion_ids.size(), ErrorKind::INVALID_ARGUMENT,
          "end_episode: workflow_output.token_rewards[" + std::to_string(c) + "] has " +
              std::to_string(output.token_rewards[c].size()) + " numbers but call " + std::to_string(c) +
              " generated " + std::to_string(ep.calls[c].completion_ids.size()) + " tokens");
    if (!output.turn_rewards.empty()) {
      counters_.ended_with_turn_rewards++;
      TurnRewardEpisode kept{episode_uuid, client_uuid, task_id, output.turn_rewards};
      if (kept.turn_rewards.size() > config_.max_turn_rewards)
        kept.turn_rewards.resize(config_.max_turn_rewards);
      turn_reward_episodes_.push_back(std::move(kept));
      while (turn_reward_episodes_.size() > config_.turn_reward_history) turn_reward_episodes_.pop_front();
    }
    if (!output.reward) {
      counters_.ended_without_reward++;
      free_slot_locked(episode_uuid, true);
      outcome.accepted = false;
      outcome.note = "episode " + episode_uuid +
                     " ended without a reward (null); it was dropped and will not be trained on";
      outcome.batch_ready = batch_ready_locked();
      remember_end_locked(episode_uuid, client_uuid, outcome);
      early = std::move(outcome);
      return;
    }
    // Merging can be long for big contexts: do it outside the lock. The episode stays
    // registered (and running) meanwhile so the batch cannot be taken without it.
    ep.ending = true;
    ep.in_flight = 0;
    optional_task_id = ep.optional_task_id;
    calls = std::move(ep.calls);
    ep.calls.clear();
    key_to_episode_.erase(ep.api_key);
  }();
  if (waiting) return;
  if (early) return done(std::move(*early), nullptr);

  // From here the episode is "ending": whatever fails (allocation, merging, the journal's
  // call) drops it and answers UNAVAILABLE, to this end and its retries, never leaving it
  // ending (ROLLING_POST would wait for it forever).
  // Answered once, by the completion or by the failure below, whichever comes first.
  auto reply = std::make_shared<EndDone>(std::move(done));
  try {
    finish_end(client_uuid, episode_uuid, task_id, output, std::move(calls), std::move(optional_task_id),
               reply);
  } catch (...) {
    std::string why = "unknown error";
    try {
      throw;
    } catch (const std::exception& e) {
      why = e.what();
    } catch (...) {}
    std::vector<EndDone> waiters;
    EndDone answer;
    {
      std::lock_guard lock(mu_);
      answer = std::exchange(*reply, EndDone());
      if (answer) waiters = fail_end_locked(episode_uuid);
    }
    const auto error = std::make_exception_ptr(
        SwarmError(ErrorKind::UNAVAILABLE, "end_episode: episode " + episode_uuid + " could not be ended (" +
                                               why + "); it was dropped: run the task again"));
    for (EndDone& w : waiters) w(EndOutcome{}, error);
    if (answer) answer(EndOutcome{}, error);
  }
}

bool RolloutPool::remembers_end(const std::string& episode_uuid) const {
  std::lock_guard lock(mu_);
  return remembered_ends_.contains(episode_uuid);
}

std::vector<RolloutPool::EndDone> RolloutPool::fail_end_locked(const std::string& episode_uuid) {
  std::vector<EndDone> waiters;
  auto it = episodes_.find(episode_uuid);
  if (it == episodes_.end() || !it->second->ending) return waiters;
  waiters = std::move(it->second->end_waiters);
  counters_.end_failed++;
  free_slot_locked(episode_uuid, true);
  return waiters;
}

void RolloutPool::remember_end_locked(const std::string& episode_uuid, const std::string& client_uuid,
                                      const EndOutcome& outcome) {
  auto [it, inserted] = remembered_ends_.insert_or_assign(episode_uuid, RememberedEnd{client_uuid, outcome});
  if (!inserted) return;
  remembered_order_.push_back(episode_uuid);
  while (remembered_order_.size() > kRememberedEnds) {
    remembered_ends_.erase(remembered_order_.front());
    remembered_order_.pop_front();
  }
}

void RolloutPool::finish_end(const std::string& client_uuid, const std::string& episode_uuid,
                             const std::string& task_id, const WorkflowOutput& output,
                             std::vector<LlmCall> calls, std::string optional_task_id,
                             const std::shared_ptr<EndDone>& reply) {
  FinishedEpisode finished;
  finished.episode_uuid = episode_uuid;
  finished.client_uuid = client_uuid;
  finished.task_id = task_id;
  finished.reward = *output.reward;
  finished.is_success = output.is_success;
  finished.log_metrics = output.log_metrics;
  finished.optional_task_id = std::move(optional_task_id);
  if (output.turn_rewards.size() == calls.size()) finished.turn_rewards = output.turn_rewards;
  if (!calls.empty() &&
      std::all_of(calls.begin(), calls.end(), [](const LlmCall& c) { return !c.exchange_record.empty(); })) {
    for (LlmCall& c : calls) finished.exchange_calls.push_back(std::move(c.exchange_record));
    finished.metadata_json = output.metadata_json;
    finished.task_metadata_json = output.task_metadata_json;
  }
  finished.samples = merge_calls_into_samples(calls);
  if (!output.token_rewards.empty())
    for (Sample& s : finished.samples) {
      s.token_rewards.assign(s.token_ids.size(), 0.0f);
      std::vector<size_t> next(s.calls.size(), 0);  // per call of the sample: its next completion token
      for (size_t t = 0; t < s.token_ids.size(); ++t) {
        const int32_t k = s.token_call[t];
        if (k < 0) continue;
        const auto& rewards =
            output.token_rewards[static_cast<size_t>(s.calls[static_cast<size_t>(k)].index)];
        s.token_rewards[t] = static_cast<float>(rewards[next[static_cast<size_t>(k)]++]);
      }
    }
  for (const Sample& s : finished.samples)
    for (size_t t = 0; t < s.policy_versions.size(); ++t)
      if (s.loss_mask[t] && (finished.min_version < 0 || s.policy_versions[t] < finished.min_version))
        finished.min_version = s.policy_versions[t];
  for (Sample& s : finished.samples) {
    s.task_id = task_id;
    s.episode_uuid = episode_uuid;
    s.reward = finished.reward;
  }
  std::shared_ptr<EpisodeJournal> journal;
  {
    std::lock_guard lock(mu_);
    journal = journal_.lock();
  }
  // Cached (and answered) once durable: a crash from then on loses nothing acknowledged.
  const bool list_mismatch = output.turn_rewards_from_list && output.turn_rewards.size() != calls.size();
  const size_t list_size = output.turn_rewards.size(), n_calls = calls.size();
  auto fin = std::make_shared<FinishedEpisode>(std::move(finished));
  auto complete = [this, fin, episode_uuid, client_uuid, list_mismatch, list_size, n_calls,
                   has_journal = journal != nullptr, reply](std::exception_ptr stored) {
    std::vector<EndDone> waiters;
    std::unique_lock lock(mu_);
    EndDone answer = std::exchange(*reply, EndDone());
    if (!answer) return;  // the end already failed (the journal's call threw) and was answered
    if (auto it = episodes_.find(episode_uuid); it != episodes_.end())
      waiters = std::move(it->second->end_waiters);
    if (stored) {
      counters_.store_failures++;
      free_slot_locked(episode_uuid, true);
      lock.unlock();
      for (EndDone& w : waiters) w(EndOutcome{}, stored);
      return answer(EndOutcome{}, stored);
    }
    EndOutcome outcome = cache_ended_locked(std::move(*fin), list_mismatch, list_size, n_calls, has_journal);
    remember_end_locked(episode_uuid, client_uuid, outcome);
    lock.unlock();
    for (EndDone& w : waiters) w(outcome, nullptr);
    answer(std::move(outcome), nullptr);
  };
  if (journal)
    journal->record_async(*fin, std::move(complete));
  else
    complete(nullptr);
}

EndOutcome RolloutPool::cache_ended_locked(FinishedEpisode finished, bool list_mismatch, size_t list_size,
                                           size_t n_calls, bool stored) {
  const std::string episode_uuid = finished.episode_uuid;
  EndOutcome outcome;
  if (episodes_.find(episode_uuid) == episodes_.end()) {
    // cancel_all (stop_engine) ran while we merged; it already counted the episode. A stored
    // copy stays: the next start of this experiment trains on it.
    outcome.accepted = false;
    outcome.note = "episode " + episode_uuid + " was cancelled (engine stopped) while ending" +
                   (stored ? "; it is stored and a --resume of this experiment trains on it" : "");
    return outcome;
  }
  counters_.ended++;
  if (list_mismatch)
    outcome.note = "episode " + episode_uuid + " sent a list reward of " + std::to_string(list_size) +
                   " values for " + std::to_string(n_calls) + " LLM calls: trained on their sum (" +
                   std::to_string(finished.reward) + ") as the episode's reward, not per call";
  if (n_calls == 0)  // after what the list reward note says, if any
    outcome.note += (outcome.note.empty() ? "episode " + episode_uuid : std::string("; it")) +
                    " made no LLM call: it holds no sample, so nothing of it is trained";
  // More than one sample: some request's history did not extend an earlier one (edited,
  // truncated or re-rendered to other ids), so the episode trains as several samples.
  if (finished.samples.size() > 1) counters_.episodes_split_by_drift++;
  cache_finished_locked(std::move(finished));
  free_slot_locked(episode_uuid, true);
  outcome.batch_ready = batch_ready_locked();
  return outcome;
}

bool RolloutPool::abort_episode(const std::string& client_uuid, const std::string& episode_uuid,
                                bool delete_record, bool declare_client_active) {
  std::lock_guard lock(mu_);
  if (!running_episode(episodes_, episode_uuid)) return false;
  owned_episode_locked(client_uuid, episode_uuid);  // FORBIDDEN for another client's episode
  counters_.aborted++;
  free_slot_locked(episode_uuid, !delete_record);
  // As AgentJet's server does: an abort also declares the client active.
  if (declare_client_active) register_active_client_locked(client_uuid);
  return true;
}

AgreeResult RolloutPool::agree_sync_weight(const std::string& client_uuid) {
  std::lock_guard lock(mu_);
  SWARM_REQUIRE(
      is_agree_method(config_.method), ErrorKind::CONFLICT,
      std::string(
          "agree_sync_weight needs sample_collection_method "
          "rollout_until_any_client_agree_sync_weight or rollout_until_all_clients_agree_sync_weight; "
          "this run uses ") +
          collection_method_name(config_.method));
  expire_active_clients_locked();
  AgreeResult result;
  auto it = active_clients_.find(client_uuid);
  if (it == active_clients_.end()) {
    result.failure_reason =
        "Client " + client_uuid +
        " is not in the active list -- it must have ended or aborted at least one episode "
        "(with declare_client_active) since the last weight sync before agreeing.";
    return result;
  }
  if (finished_cached_ == 0) {
    result.failure_reason =
        "Nothing to train on yet: no finished train episode is cached since the last weight "
        "sync. Try again after an episode ends.";
    return result;
  }
  it->second.allowed_sync_weight = true;
  it->second.last_activity = clock_->now();
  result.success = true;
  return result;
}

bool RolloutPool::can_continue(const std::string& client_uuid, const std::string& episode_uuid) const {
  std::lock_guard lock(mu_);
  const auto* ep = running_episode(episodes_, episode_uuid);
  return ep && ep->client_uuid == client_uuid;
}

std::vector<std::string> RolloutPool::reap_idle() {
  std::lock_guard lock(mu_);
  const TimePoint now = clock_->now();
  std::vector<std::string> reaped;
  for (auto& [uuid, ep] : episodes_) {
    if (!ep->claimed || ep->ending) continue;
    if (ep->in_flight > 0) {
      // A generation in progress is activity even if it takes longer than the timeout.
      ep->last_activity = now;
      continue;
    }
    if (seconds_between(ep->last_activity, now) > ep->timeout_s) reaped.push_back(uuid);
  }
  for (const std::string& uuid : reaped) {
    counters_.timed_out++;
    free_slot_locked(uuid, true);
  }
  expire_active_clients_locked();
  return reaped;
}

bool RolloutPool::batch_ready() const {
  std::lock_guard lock(mu_);
  return batch_ready_locked();
}

int64_t RolloutPool::running() const {
  std::lock_guard lock(mu_);
  return running_locked();
}

TrainBatch RolloutPool::take_batch() {
  std::lock_guard lock(mu_);
  return take_batch_locked();
}

TrainBatch RolloutPool::take_batch_locked() {
  TrainBatch batch;
  const bool take_all =
      config_.method == CollectionMethod::ENOUGH_EPISODES || is_agree_method(config_.method);
  std::vector<std::string> kept;
  for (const std::string& task_id : group_order_) {
    auto it = groups_.find(task_id);
    Group& g = *it->second;
    if (!take_all && !complete_locked(g)) {
      kept.push_back(task_id);
      continue;
    }
    if (g.episodes.empty()) {  // every member was dropped as stale: nothing to train
      groups_.erase(it);
      continue;
    }
    finished_cached_ -= static_cast<int64_t>(g.episodes.size());
    for (FinishedEpisode& e : g.episodes) batch.episodes.push_back(std::move(e));
    batch.num_tasks++;
    groups_.erase(it);
  }
  group_order_ = std::move(kept);
  counters_.batches_taken++;
  active_clients_.clear();  // agreements are per weight sync
  eval_reward_ = {};
  eval_log_metrics_.clear();
  eval_episodes_ = 0;
  return batch;
}

int64_t RolloutPool::drop_stale(int64_t min_version) {
  std::lock_guard lock(mu_);
  return drop_stale_locked(min_version);
}

int64_t RolloutPool::drop_stale_locked(int64_t min_version) {
  int64_t n = 0;
  {
    std::vector<std::string> forgotten;
    auto too_old = [&](const FinishedEpisode& e) {
      const bool old = e.min_version >= 0 && e.min_version < min_version;
      if (old && !journal_.expired()) forgotten.push_back(e.episode_uuid);
      return old;
    };
    // A group emptied by drops stays (as its drop count) while more members may come; it goes
    // once it is complete, or, oldest first, when there are more such records than episodes
    // the cache may hold.
    std::vector<std::string> gone;
    int64_t empty_groups = 0;
    for (const std::string& task_id : group_order_) {
      Group& g = *groups_.at(task_id);
      const auto before = g.episodes.size();
      std::erase_if(g.episodes, too_old);
      const auto dropped = static_cast<int64_t>(before - g.episodes.size());
      g.stale_dropped += dropped;
      n += dropped;
      if (g.episodes.empty()) {
        if (complete_locked(g))
          gone.push_back(task_id);
        else
          ++empty_groups;
      }
    }
    for (const std::string& task_id : group_order_) {
      if (empty_groups <= config_.max_cached_episodes) break;
      const Group& g = *groups_.at(task_id);
      if (g.episodes.empty() && !complete_locked(g)) gone.push_back(task_id), --empty_groups;
    }
    for (const std::string& task_id : gone) {
      groups_.erase(task_id);
      std::erase(group_order_, task_id);
    }
    finished_cached_ -= n;
    counters_.stale_dropped_episodes += n;
    if (auto j = journal_.lock()) j->forget(std::move(forgotten));
  }
  return n;
}

TrainBatch RolloutPool::take_batch_fresh(int64_t min_version, int64_t* dropped) {
  std::lock_guard lock(mu_);
  const int64_t n = drop_stale_locked(min_version);
  if (dropped != nullptr) *dropped = n;
  return take_batch_locked();
}

void RolloutPool::set_journal(const std::shared_ptr<EpisodeJournal>& journal) {
  std::lock_guard lock(mu_);
  journal_ = journal;
}

int64_t RolloutPool::restore_finished(std::vector<FinishedEpisode> episodes) {
  std::lock_guard lock(mu_);
  const auto n = static_cast<int64_t>(episodes.size());
  for (FinishedEpisode& e : episodes) cache_finished_locked(std::move(e));
  counters_.restored += n;
  return n;
}

void RolloutPool::set_train_admission_limit(int64_t limit) {
  std::lock_guard lock(mu_);
  train_admission_limit_ = limit;
}

void RolloutPool::cancel_all() {
  std::vector<std::pair<std::string, EndDone>> waiters;  // retries of ends in progress
  {
    std::lock_guard lock(mu_);
    counters_.cancelled += running_locked();
    accepting_ = false;
    for (auto& [uuid, ep] : episodes_)
      for (EndDone& w : ep->end_waiters) waiters.emplace_back(uuid, std::move(w));
    episodes_.clear();
    key_to_episode_.clear();
    unclaimed_.clear();
    groups_.clear();
    group_order_.clear();
    finished_cached_ = 0;
    active_clients_.clear();
    eval_reward_ = {};
    eval_log_metrics_.clear();
    eval_episodes_ = 0;
  }
  for (auto& [uuid, w] : waiters) {
    EndOutcome cancelled;
    cancelled.accepted = false;
    cancelled.note = "episode " + uuid + " was cancelled (engine stopped) while ending";
    w(std::move(cancelled), nullptr);
  }
}

PoolSnapshot RolloutPool::snapshot() const {
  std::lock_guard lock(mu_);
  PoolSnapshot snap;
  const TimePoint now = clock_->now();
  snap.config = config_;
  snap.accepting_claims = accepting_;
  snap.unclaimed = static_cast<int64_t>(unclaimed_.size());
  snap.running = running_locked();
  snap.finished_episodes = finished_cached_;
  snap.target_episodes = config_.batch_size * config_.num_repeat;
  snap.target_tasks = config_.batch_size;

  std::vector<const Episode*> running;
  for (const auto& [uuid, ep] : episodes_) {
    if (ep->claimed) running.push_back(ep.get());
  }
  std::sort(running.begin(), running.end(),
            [](const Episode* a, const Episode* b) { return a->claim_seq < b->claim_seq; });
  for (const Episode* ep : running) {
    RunningEpisodeInfo info;
    info.episode_uuid = ep->uuid;
    info.client_uuid = ep->client_uuid;
    info.episode_type = ep->type;
    info.llm_calls = static_cast<int64_t>(ep->calls.size());
    info.in_flight_calls = ep->in_flight;
    info.seconds_idle = seconds_between(ep->last_activity, now);
    info.discard_episode_timeout = ep->timeout_s;
    info.seconds_since_claim = seconds_between(ep->claimed_at, now);
    info.optional_task_id = ep->optional_task_id;
    snap.running_episodes.push_back(std::move(info));
  }

  for (const std::string& task_id : group_order_) {
    const Group& g = *groups_.at(task_id);
    const RewardStats stats = reward_stats(g.episodes);
    TaskGroupInfo info;
    info.task_id = task_id;
    info.episodes = static_cast<int64_t>(g.episodes.size());
    for (const FinishedEpisode& e : g.episodes) {
      info.episode_uuids.push_back(e.episode_uuid);
      info.rewards.push_back(e.reward);
      if (!e.optional_task_id.empty()) info.throttled_client_uuids.push_back(e.client_uuid);
    }
    info.reward_mean = stats.mean;
    info.reward_std = stats.std;
    info.complete = complete_locked(g);
    info.dummy = stats.all_equal;
    if (info.complete) {
      snap.complete_tasks++;
      if (!info.dummy) snap.complete_non_dummy_tasks++;
    }
    snap.tasks.push_back(std::move(info));
  }

  for (const auto& [uuid, c] : active_clients_) {
    const double idle = seconds_between(c.last_activity, now);
    if (idle > config_.client_active_seconds) continue;  // expired; the janitor drops it
    snap.active_clients.push_back({uuid, idle, c.allowed_sync_weight});
  }
  std::sort(
      snap.active_clients.begin(), snap.active_clients.end(),
      [](const ActiveClientInfo& a, const ActiveClientInfo& b) { return a.seconds_idle < b.seconds_idle; });
  snap.turn_reward_episodes.assign(turn_reward_episodes_.begin(), turn_reward_episodes_.end());
  snap.recent_rewards.assign(recent_rewards_.begin(), recent_rewards_.end());
  snap.eval_metrics["eval/episodes"] = static_cast<double>(eval_episodes_);
  if (eval_reward_.count > 0) {
    snap.eval_metrics["eval/reward_mean"] = eval_reward_.sum / static_cast<double>(eval_reward_.count);
  }
  for (const auto& [name, acc] : eval_log_metrics_) {
    snap.eval_metrics["eval/" + name] = acc.sum / static_cast<double>(acc.count);
  }
  snap.counters = counters_;
  return snap;
}

PoolCounters RolloutPool::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

// ---------------------------------------------------------------- private helpers

void RolloutPool::register_slots_locked() {
  while (static_cast<int64_t>(unclaimed_.size()) + running_locked() < config_.max_parallel_episodes) {
    auto ep = std::make_unique<Episode>();
    ep->uuid = random_uuid();
    unclaimed_.push_back(ep->uuid);
    episodes_.emplace(ep->uuid, std::move(ep));
  }
}

void RolloutPool::free_slot_locked(const std::string& episode_uuid, bool reregister) {
  auto it = episodes_.find(episode_uuid);
  if (it != episodes_.end()) {
    // Only revoke the key if it still points here (it always should; keys are unique).
    auto key_it = key_to_episode_.find(it->second->api_key);
    if (key_it != key_to_episode_.end() && key_it->second == episode_uuid) {
      key_to_episode_.erase(key_it);
    }
    if (!it->second->claimed) {
      unclaimed_.erase(std::remove(unclaimed_.begin(), unclaimed_.end(), episode_uuid), unclaimed_.end());
    }
    episodes_.erase(it);
  }
  if (reregister && accepting_) register_slots_locked();
}

int64_t RolloutPool::running_locked() const {
  return static_cast<int64_t>(episodes_.size()) - static_cast<int64_t>(unclaimed_.size());
}

void RolloutPool::register_active_client_locked(const std::string& client_uuid) {
  auto [it, inserted] = active_clients_.try_emplace(client_uuid);
  it->second.last_activity = clock_->now();
  if (!inserted || active_clients_.size() <= config_.max_active_clients) return;
  // Bounded: drop the least recently active other client.
  auto oldest = active_clients_.end();
  for (auto c = active_clients_.begin(); c != active_clients_.end(); ++c)
    if (c != it &&
        (oldest == active_clients_.end() || c->second.last_activity < oldest->second.last_activity))
      oldest = c;
  if (oldest != active_clients_.end()) active_clients_.erase(oldest);
}

void RolloutPool::refresh_active_client_locked(const std::string& client_uuid) {
  auto it = active_clients_.find(client_uuid);
  if (it != active_clients_.end()) it->second.last_activity = clock_->now();
}

void RolloutPool::expire_active_clients_locked() {
  const TimePoint now = clock_->now();
  std::erase_if(active_clients_, [&](const auto& kv) {
    return seconds_between(kv.second.last_activity, now) > config_.client_active_seconds;
  });
}

bool RolloutPool::batch_ready_locked() const {
  if (is_agree_method(config_.method)) {
    // Expired clients are dropped by the janitor (reap_idle) and by agree_sync_weight.
    if (finished_cached_ == 0 || active_clients_.empty()) return false;
    bool any = false, all = true;
    for (const auto& [uuid, c] : active_clients_) {
      any = any || c.allowed_sync_weight;
      all = all && c.allowed_sync_weight;
    }
    return config_.method == CollectionMethod::ANY_CLIENT_AGREES ? any : all;
  }
  if (config_.method == CollectionMethod::ENOUGH_EPISODES) {
    return finished_cached_ >= config_.batch_size * config_.num_repeat;
  }
  int64_t complete = 0;
  for (const auto& [task_id, g] : groups_) {
    if (g->episodes.empty() || !complete_locked(*g)) continue;
    if (config_.method == CollectionMethod::ENOUGH_NON_DUMMY_TASKS && reward_stats(g->episodes).all_equal) {
      continue;
    }
    complete++;
  }
  return complete >= config_.batch_size;
}

RolloutPool::Episode& RolloutPool::owned_episode_locked(const std::string& client_uuid,
                                                        const std::string& episode_uuid) {
  auto* ep = running_episode(episodes_, episode_uuid);
  SWARM_REQUIRE(ep, ErrorKind::NOT_FOUND, not_found_message(episode_uuid));
  SWARM_REQUIRE(ep->client_uuid == client_uuid, ErrorKind::FORBIDDEN,
                "episode " + episode_uuid + " belongs to another client");
  return *ep;
}

void RolloutPool::cache_finished_locked(FinishedEpisode episode) {
  recent_rewards_.push_back(episode.reward);
  while (recent_rewards_.size() > config_.reward_history) recent_rewards_.pop_front();

  episode.finish_seq = ++finish_seq_;
  auto [it, inserted] = groups_.try_emplace(episode.task_id);
  if (inserted) {
    it->second = std::make_unique<Group>();
    group_order_.push_back(episode.task_id);
  }
  it->second->episodes.push_back(std::move(episode));
  finished_cached_++;
  if (!batch_ready_locked()) apply_safety_valve_locked();
}

void RolloutPool::record_eval_locked(const WorkflowOutput& output) {
  eval_episodes_++;
  if (output.reward) {
    eval_reward_.sum += *output.reward;
    eval_reward_.count++;
  }
  // Distinct names are bounded per step (each episode's own are, at the route; clients could
  // still send new ones every episode): later names are left out of this step's means.
  constexpr size_t kMaxEvalLogMetrics = 1024;
  for (const auto& [name, value] : output.log_metrics) {
    if (!std::isfinite(value)) continue;  // one NaN would hide every other episode's value
    if (eval_log_metrics_.size() >= kMaxEvalLogMetrics && !eval_log_metrics_.contains(name)) {
      static std::atomic<bool> told{false};
      if (!told.exchange(true))
        spdlog::warn(
            "eval log_metrics: more than {} distinct names in one step; later names are left out (said once)",
            kMaxEvalLogMetrics);
      continue;
    }
    MeanAccumulator& acc = eval_log_metrics_[name];
    acc.sum += value;
    acc.count++;
  }
}

// Bounds the cache when episodes pile up without completing a batch (e.g. many tasks
// started, few finished). Oldest incomplete groups go first: they are the least likely to
// complete soon. Complete groups are never dropped, because they count toward the batch;
// so if only complete groups are left the cache may stay above the threshold until the
// batch is taken (it is then bounded by the batch target plus episodes in flight). With
// the non-dummy method, complete dummy groups can never count, so they go next.
// With the episode method every cached episode counts toward the target, so whenever the
// batch is not ready the cache is already below the target and nothing is dropped.
void RolloutPool::apply_safety_valve_locked() {
  if (config_.method == CollectionMethod::ENOUGH_EPISODES) return;
  auto pick = [&](bool dummies) -> const std::string* {
    // Agree methods train every cached episode, but nobody may agree for a long time: the
    // oldest groups go first, whole, to keep memory bounded.
    if (is_agree_method(config_.method)) return group_order_.empty() ? nullptr : &group_order_.front();
    for (const std::string& task_id : group_order_) {
      const Group& g = *groups_.at(task_id);
      const bool complete = complete_locked(g);
      if (!dummies && !complete && !g.episodes.empty()) return &task_id;
      if (dummies && complete && reward_stats(g.episodes).all_equal) return &task_id;
    }
    return nullptr;
  };
  while (finished_cached_ > config_.max_cached_episodes) {
    const std::string* victim = pick(false);
    if (victim == nullptr && config_.method == CollectionMethod::ENOUGH_NON_DUMMY_TASKS) {
      victim = pick(true);
    }
    if (victim == nullptr) break;
    drop_group_locked(std::string(*victim));
  }
}

void RolloutPool::drop_group_locked(const std::string& task_id) {
  auto it = groups_.find(task_id);
  if (it == groups_.end()) return;
  const auto n = static_cast<int64_t>(it->second->episodes.size());
  finished_cached_ -= n;
  counters_.valve_dropped_groups++;
  counters_.valve_dropped_episodes += n;
  if (auto j = journal_.lock()) {
    std::vector<std::string> uuids;
    for (const FinishedEpisode& e : it->second->episodes) uuids.push_back(e.episode_uuid);
    j->forget(std::move(uuids));
  }
  groups_.erase(it);
  group_order_.erase(std::remove(group_order_.begin(), group_order_.end(), task_id), group_order_.end());
}

// ------------------------------------------------------------------ counters

namespace {
// Every counter once, so sum and (de)serialisation cannot drift apart.
constexpr std::pair<const char*, int64_t PoolCounters::*> kCounterFields[] = {
    {"claimed", &PoolCounters::claimed},
    {"ended", &PoolCounters::ended},
    {"ended_eval", &PoolCounters::ended_eval},
    {"ended_without_reward", &PoolCounters::ended_without_reward},
    {"ended_with_turn_rewards", &PoolCounters::ended_with_turn_rewards},
    {"episodes_split_by_drift", &PoolCounters::episodes_split_by_drift},
    {"aborted", &PoolCounters::aborted},
    {"timed_out", &PoolCounters::timed_out},
    {"cancelled", &PoolCounters::cancelled},
    {"llm_calls", &PoolCounters::llm_calls},
    {"late_calls_dropped", &PoolCounters::late_calls_dropped},
    {"valve_dropped_groups", &PoolCounters::valve_dropped_groups},
    {"valve_dropped_episodes", &PoolCounters::valve_dropped_episodes},
    {"batches_taken", &PoolCounters::batches_taken},
    {"stale_dropped_episodes", &PoolCounters::stale_dropped_episodes},
    {"claims_held_by_staleness", &PoolCounters::claims_held_by_staleness},
    {"restored", &PoolCounters::restored},
    {"store_failures", &PoolCounters::store_failures},
    {"end_replayed", &PoolCounters::end_replayed},
    {"end_failed", &PoolCounters::end_failed},
};
}  // namespace

PoolCounters& PoolCounters::operator+=(const PoolCounters& other) {
  for (const auto& [name, field] : kCounterFields) this->*field += other.*field;
  return *this;
}

nlohmann::json PoolCounters::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, field] : kCounterFields) j[name] = this->*field;
  return j;
}

PoolCounters PoolCounters::from_json(const nlohmann::json& j) {
  PoolCounters c;
  for (const auto& [name, field] : kCounterFields) c.*field = j.value(name, int64_t{0});
  return c;
}

}  // namespace swarm
