#include "trainer/grpo_batch.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <unordered_map>

#include "common/error.hpp"

namespace swarm {

AdvantageEstimator parse_advantage_estimator(const std::string& name) {
  if (name == "grpo") return AdvantageEstimator::GRPO;
  if (name == "grpo_no_std") return AdvantageEstimator::GRPO_NO_STD;
  if (name == "reinforce_baseline") return AdvantageEstimator::REINFORCE_BASELINE;
  if (name == "gae") return AdvantageEstimator::GAE;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                   "unknown advantage_estimator '" + name + "' (grpo, grpo_no_std, reinforce_baseline, gae)");
}

GroupBy parse_group_by(const std::string& name) {
  if (name == "task") return GroupBy::TASK;
  if (name == "task_agent_turn") return GroupBy::TASK_AGENT_TURN;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "unknown group_by '" + name + "' (task, task_agent_turn)");
}

LossAggregation parse_loss_aggregation(const std::string& name) {
  if (name == "token-mean") return LossAggregation::TOKEN_MEAN;
  if (name == "seq-mean-token-mean") return LossAggregation::SEQ_MEAN_TOKEN_MEAN;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                   "unknown loss_agg_mode '" + name + "' (token-mean, seq-mean-token-mean)");
}

KlEstimator parse_kl_estimator(const std::string& name) {
  if (name == "k1") return KlEstimator::K1;
  if (name == "k3") return KlEstimator::K3;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "unknown kl_estimator '" + name + "' (k1, k3)");
}

int64_t PreparedBatch::trained_tokens() const {
  int64_t n = 0;
  for (const auto& s : sequences) n += s.trained_tokens;
  return n;
}

namespace {

int64_t count_trained(const Sample& s) {
  int64_t n = 0;
  for (size_t t = 1; t < s.loss_mask.size() && t < s.token_ids.size(); ++t) n += s.loss_mask[t] ? 1 : 0;
  return n;
}

double advantage_of(AdvantageEstimator estimator, double reward, double mean, double std, double batch_mean,
                    double eps) {
  switch (estimator) {
    case AdvantageEstimator::GRPO:
      return (reward - mean) / (std + eps);
    case AdvantageEstimator::GRPO_NO_STD:
      return reward - mean;
    case AdvantageEstimator::REINFORCE_BASELINE:
      return reward - batch_mean;
    case AdvantageEstimator::GAE:
      return 0.0;  // per token, from the critic (the trainer)
  }
  return 0.0;
}

// Whether a group trains: it is left out only where the estimator makes every advantage zero.
// grpo and grpo_no_std subtract the group's mean, so a group whose rewards are all equal (a group
// of one sample too) has none (tested on the rewards: their mean in floating point need not equal
// them exactly); reinforce_baseline subtracts the batch's mean, so a group has signal unless
// each of its rewards is that mean.
bool has_signal(AdvantageEstimator estimator, bool rewards_all_equal, bool any_nonzero_advantage) {
  switch (estimator) {
    case AdvantageEstimator::GRPO:
    case AdvantageEstimator::GRPO_NO_STD:
      return !rewards_all_equal;
    case AdvantageEstimator::REINFORCE_BASELINE:
      return any_nonzero_advantage;
    case AdvantageEstimator::GAE:
      return true;
  }
  return true;
}

void fill_stats(PreparedBatch& out) {
  if (out.sequences.empty()) return;
  double sum = 0.0, sq = 0.0;
  out.stats.min = out.stats.max = out.sequences.front().advantage;
  for (const auto& s : out.sequences) {
    sum += s.advantage;
    sq += s.advantage * s.advantage;
    out.stats.min = std::min(out.stats.min, s.advantage);
    out.stats.max = std::max(out.stats.max, s.advantage);
  }
  const double n = static_cast<double>(out.sequences.size());
  out.stats.mean = sum / n;
  out.stats.std = std::sqrt(std::max(0.0, sq / n - out.stats.mean * out.stats.mean));
}

// AT-GRPO (prepare_batch's comment).
PreparedBatch prepare_by_agent_turn(const TrainBatch& batch, AdvantageEstimator estimator, double eps) {
  struct Unit {
    const Sample* sample;
    size_t call;  // index into sample->calls
    double reward;
    double advantage = 0.0;
  };
  std::vector<Unit> units;
  std::vector<std::vector<size_t>> groups;  // indices into units
  std::unordered_map<std::string, size_t> group_of;
  double batch_sum = 0.0;
  for (const FinishedEpisode& ep : batch.episodes)
    for (const Sample& s : ep.samples)
      for (size_t k = 0; k < s.calls.size(); ++k) {
        const SampleCall& call = s.calls[k];
        const double reward =
            ep.turn_rewards.empty() ? s.reward : ep.turn_rewards.at(static_cast<size_t>(call.index));
        const std::string key = s.task_id + '\x1f' + call.agent + '\x1f' + std::to_string(call.turn);
        auto [it, fresh] = group_of.try_emplace(key, groups.size());
        if (fresh) groups.emplace_back();
        groups[it->second].push_back(units.size());
        units.push_back({&s, k, reward});
        batch_sum += reward;
      }
  const double batch_mean = units.empty() ? 0.0 : batch_sum / static_cast<double>(units.size());
  PreparedBatch out;
  out.stats.groups = static_cast<int64_t>(groups.size());
  std::unordered_map<const Sample*, std::vector<size_t>> units_of;  // the sample's units with signal
  for (const auto& members : groups) {
    const double n = static_cast<double>(members.size());
    double sum = 0.0;
    for (size_t u : members) sum += units[u].reward;
    const double mean = sum / n;
    double sq = 0.0;
    bool all_equal = true;
    for (size_t u : members) {
      sq += (units[u].reward - mean) * (units[u].reward - mean);
      all_equal = all_equal && units[u].reward == units[members.front()].reward;
    }
    const double std = all_equal ? 0.0 : std::sqrt(sq / (n - 1.0));
    bool any_nonzero = false;
    for (size_t u : members) {
      units[u].advantage = advantage_of(estimator, units[u].reward, mean, std, batch_mean, eps);
      any_nonzero = any_nonzero || units[u].advantage != 0.0;
    }
    if (!has_signal(estimator, all_equal, any_nonzero)) {
      ++out.stats.zero_variance_groups;
      out.stats.skipped_samples += static_cast<int64_t>(members.size());
      continue;
    }
    for (size_t u : members) units_of[units[u].sample].push_back(u);
  }
  // Sequences: samples with at least one unit with signal, grouped by task for mini-batches.
  std::unordered_map<std::string, size_t> task_group;
  for (const FinishedEpisode& ep : batch.episodes)
    for (const Sample& s : ep.samples) {
      auto it = units_of.find(&s);
      const int64_t trained = count_trained(s);
      if (it == units_of.end() || trained == 0) continue;
      std::vector<double> per_call(s.calls.size(), 0.0);
      for (size_t u : it->second) per_call[units[u].call] = units[u].advantage;
      TrainSequence seq;
      seq.sample = &s;
      seq.length = static_cast<int64_t>(s.token_ids.size());
      seq.trained_tokens = trained;
      seq.token_advantage.assign(s.token_ids.size(), 0.0f);
      double sum = 0.0;
      for (size_t t = 0; t < s.token_ids.size(); ++t) {
        const int32_t k = t < s.token_call.size() ? s.token_call[t] : -1;
        if (k < 0 || !s.loss_mask[t]) continue;
        seq.token_advantage[t] = static_cast<float>(per_call[static_cast<size_t>(k)]);
        if (t >= 1) sum += per_call[static_cast<size_t>(k)];
      }
      seq.advantage = sum / static_cast<double>(trained);
      auto [g, fresh] = task_group.try_emplace(s.task_id, out.groups.size());
      if (fresh) out.groups.emplace_back();
      seq.group = static_cast<int64_t>(g->second);
      out.groups[g->second].push_back(out.sequences.size());
      out.sequences.push_back(std::move(seq));
    }
  fill_stats(out);
  return out;
}

// GAE (prepare_batch's comment): every sample with trained tokens, grouped by task.
PreparedBatch prepare_for_gae(const TrainBatch& batch) {
  PreparedBatch out;
  std::unordered_map<std::string, size_t> task_group;
  for (const FinishedEpisode& ep : batch.episodes)
    for (const Sample& s : ep.samples) {
      const int64_t trained = count_trained(s);
      if (trained == 0) continue;
      TrainSequence seq;
      seq.sample = &s;
      seq.episode = &ep;
      seq.length = static_cast<int64_t>(s.token_ids.size());
      seq.trained_tokens = trained;
      auto [g, fresh] = task_group.try_emplace(s.task_id, out.groups.size());
      if (fresh) out.groups.emplace_back();
      seq.group = static_cast<int64_t>(g->second);
      out.groups[g->second].push_back(out.sequences.size());
      out.sequences.push_back(std::move(seq));
    }
  out.stats.groups = static_cast<int64_t>(out.groups.size());
  return out;
}

}  // namespace

PreparedBatch prepare_batch(const TrainBatch& batch, AdvantageEstimator estimator, double eps,
                            GroupBy group_by) {
  if (estimator == AdvantageEstimator::GAE) return prepare_for_gae(batch);
  if (group_by == GroupBy::TASK_AGENT_TURN) return prepare_by_agent_turn(batch, estimator, eps);
  // Group every sample by task, in order of the task's first arrival.
  std::vector<std::vector<const Sample*>> groups;
  std::unordered_map<std::string, size_t> group_of;
  // reinforce_baseline's baseline: the mean reward of the samples that train (those with
  // trained tokens), so their advantages sum to zero.
  double batch_sum = 0.0;
  int64_t batch_count = 0;
  for (const FinishedEpisode& ep : batch.episodes) {
    for (const Sample& s : ep.samples) {
      auto [it, fresh] = group_of.try_emplace(s.task_id, groups.size());
      if (fresh) groups.emplace_back();
      groups[it->second].push_back(&s);
      if (count_trained(s) == 0) continue;
      batch_sum += s.reward;
      ++batch_count;
    }
  }
  const double batch_mean = batch_count > 0 ? batch_sum / static_cast<double>(batch_count) : 0.0;

  PreparedBatch out;
  out.stats.groups = static_cast<int64_t>(groups.size());
  for (const auto& members : groups) {
    const double n = static_cast<double>(members.size());
    double sum = 0.0;
    for (const Sample* s : members) sum += s->reward;
    const double mean = sum / n;
    double sq = 0.0;
    bool all_equal = true;
    for (const Sample* s : members) {
      sq += (s->reward - mean) * (s->reward - mean);
      all_equal = all_equal && s->reward == members.front()->reward;
    }
    // A group of one sample has zero variance too.
    const double std = all_equal ? 0.0 : std::sqrt(sq / (n - 1.0));
    bool any_nonzero = false;
    for (const Sample* s : members)
      any_nonzero = any_nonzero || advantage_of(estimator, s->reward, mean, std, batch_mean, eps) != 0.0;
    if (!has_signal(estimator, all_equal, any_nonzero)) {
      ++out.stats.zero_variance_groups;
      out.stats.skipped_samples += static_cast<int64_t>(members.size());
      continue;
    }
    std::vector<size_t> kept;
    for (const Sample* s : members) {
      const int64_t trained = count_trained(*s);
      if (trained == 0) continue;
      TrainSequence seq;
      seq.sample = s;
      seq.group = static_cast<int64_t>(out.groups.size());
      seq.length = static_cast<int64_t>(s->token_ids.size());
      seq.trained_tokens = trained;
      seq.advantage = advantage_of(estimator, s->reward, mean, std, batch_mean, eps);
      kept.push_back(out.sequences.size());
      out.sequences.push_back(seq);
    }
    if (!kept.empty()) out.groups.push_back(std::move(kept));
  }

  fill_stats(out);
  return out;
}

std::vector<std::vector<size_t>> split_mini_batches(const PreparedBatch& batch,
                                                    int64_t tasks_per_mini_batch) {
  std::vector<std::vector<size_t>> out;
  const size_t per =
      tasks_per_mini_batch > 0 ? static_cast<size_t>(tasks_per_mini_batch) : batch.groups.size();
  for (size_t g = 0; g < batch.groups.size(); g += per) {
    std::vector<size_t> mb;
    for (size_t k = g; k < std::min(batch.groups.size(), g + per); ++k)
      mb.insert(mb.end(), batch.groups[k].begin(), batch.groups[k].end());
    out.push_back(std::move(mb));
  }
  return out;
}

namespace {

std::vector<size_t> longest_first(const PreparedBatch& batch, std::vector<size_t> seqs) {
  std::stable_sort(seqs.begin(), seqs.end(),
                   [&](size_t a, size_t b) { return batch.sequences[a].length > batch.sequences[b].length; });
  return seqs;
}

}  // namespace

std::vector<size_t> shard_for_rank(const PreparedBatch& batch, const std::vector<size_t>& mini_batch,
                                   int rank, int world_size) {
  SWARM_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size, ErrorKind::INVALID_ARGUMENT,
                "shard_for_rank: bad rank " + std::to_string(rank) + " of " + std::to_string(world_size));
  if (world_size == 1) return mini_batch;
  std::vector<int64_t> load(static_cast<size_t>(world_size), 0);
  std::vector<size_t> mine;
  for (size_t idx : longest_first(batch, mini_batch)) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += batch.sequences[idx].length;
    if (static_cast<int>(r) == rank) mine.push_back(idx);
  }
  return mine;
}

std::vector<std::vector<size_t>> plan_micro_batches(const PreparedBatch& batch,
                                                    const std::vector<size_t>& seqs, int64_t max_tokens) {
  SWARM_REQUIRE(max_tokens >= 1, ErrorKind::INVALID_ARGUMENT, "micro-batch token budget must be >= 1");
  std::vector<std::vector<size_t>> out;
  int64_t longest = 0;  // sorted longest first: the first row of a micro-batch is its longest
  for (size_t idx : longest_first(batch, seqs)) {
    const int64_t len = batch.sequences[idx].length;
    if (!out.empty() && static_cast<int64_t>(out.back().size() + 1) * longest <= max_tokens) {
      out.back().push_back(idx);
      continue;
    }
    out.push_back({idx});
    longest = len;
  }
  return out;
}

std::vector<std::vector<size_t>> plan_packed_micro_batches(const PreparedBatch& batch,
                                                           const std::vector<size_t>& seqs,
                                                           int64_t max_tokens) {
  SWARM_REQUIRE(max_tokens >= 1, ErrorKind::INVALID_ARGUMENT, "micro-batch token budget must be >= 1");
  std::vector<std::vector<size_t>> out;
  std::vector<int64_t> used;  // tokens per micro-batch
  for (size_t idx : longest_first(batch, seqs)) {
    const int64_t len = batch.sequences[idx].length;
    size_t at = 0;
    while (at < out.size() && used[at] + len > max_tokens) ++at;
    if (at == out.size()) {
      out.emplace_back();
      used.push_back(0);
    }
    out[at].push_back(idx);
    used[at] += len;
  }
  return out;
}

double learning_rate_at(double base_lr, const std::string& schedule, int64_t warmup_steps,
                        int64_t total_steps, int64_t step) {
  SWARM_REQUIRE(schedule == "constant" || schedule == "cosine", ErrorKind::INVALID_ARGUMENT,
                "unknown lr_schedule '" + schedule + "' (constant, cosine)");
  SWARM_REQUIRE(schedule == "constant" || total_steps > warmup_steps, ErrorKind::INVALID_ARGUMENT,
                "lr_schedule cosine needs total_training_steps > lr_warmup_steps");
  if (warmup_steps > 0 && step < warmup_steps)
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (schedule == "constant") return base_lr;
  const double progress = std::clamp(
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps), 0.0, 1.0);
  return base_lr * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace swarm
