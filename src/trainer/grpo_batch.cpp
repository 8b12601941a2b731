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
  throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                   "unknown advantage_estimator '" + name + "' (grpo, grpo_no_std, reinforce_baseline)");
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

}  // namespace

PreparedBatch prepare_batch(const TrainBatch& batch, AdvantageEstimator estimator, double eps) {
  // Group every sample by task, in order of the task's first arrival.
  std::vector<std::vector<const Sample*>> groups;
  std::unordered_map<std::string, size_t> group_of;
  double batch_sum = 0.0;
  int64_t batch_count = 0;
  for (const FinishedEpisode& ep : batch.episodes) {
    for (const Sample& s : ep.samples) {
      auto [it, fresh] = group_of.try_emplace(s.task_id, groups.size());
      if (fresh) groups.emplace_back();
      groups[it->second].push_back(&s);
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
    if (all_equal) {  // includes groups of one sample
      ++out.stats.zero_variance_groups;
      out.stats.skipped_samples += static_cast<int64_t>(members.size());
      continue;
    }
    const double std = std::sqrt(sq / (n - 1.0));
    std::vector<size_t> kept;
    for (const Sample* s : members) {
      const int64_t trained = count_trained(*s);
      if (trained == 0) continue;
      TrainSequence seq;
      seq.sample = s;
      seq.group = static_cast<int64_t>(out.groups.size());
      seq.length = static_cast<int64_t>(s->token_ids.size());
      seq.trained_tokens = trained;
      switch (estimator) {
        case AdvantageEstimator::GRPO: seq.advantage = (s->reward - mean) / (std + eps); break;
        case AdvantageEstimator::GRPO_NO_STD: seq.advantage = s->reward - mean; break;
        case AdvantageEstimator::REINFORCE_BASELINE: seq.advantage = s->reward - batch_mean; break;
      }
      kept.push_back(out.sequences.size());
      out.sequences.push_back(seq);
    }
    if (!kept.empty()) out.groups.push_back(std::move(kept));
  }

  if (!out.sequences.empty()) {
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
  return out;
}

std::vector<std::vector<size_t>> split_mini_batches(const PreparedBatch& batch, int64_t tasks_per_mini_batch) {
  std::vector<std::vector<size_t>> out;
  const size_t per = tasks_per_mini_batch > 0 ? static_cast<size_t>(tasks_per_mini_batch) : batch.groups.size();
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

std::vector<size_t> shard_for_rank(const PreparedBatch& batch, const std::vector<size_t>& mini_batch, int rank,
                                   int world_size) {
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

std::vector<std::vector<size_t>> plan_micro_batches(const PreparedBatch& batch, const std::vector<size_t>& seqs,
                                                    int64_t max_tokens) {
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

double learning_rate_at(double base_lr, const std::string& schedule, int64_t warmup_steps, int64_t total_steps,
                        int64_t step) {
  SWARM_REQUIRE(schedule == "constant" || schedule == "cosine", ErrorKind::INVALID_ARGUMENT,
                "unknown lr_schedule '" + schedule + "' (constant, cosine)");
  SWARM_REQUIRE(schedule == "constant" || total_steps > warmup_steps, ErrorKind::INVALID_ARGUMENT,
                "lr_schedule cosine needs total_training_steps > lr_warmup_steps");
  if (warmup_steps > 0 && step < warmup_steps)
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (schedule == "constant") return base_lr;
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) /
                                         static_cast<double>(total_steps - warmup_steps), 0.0, 1.0);
  return base_lr * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace swarm
