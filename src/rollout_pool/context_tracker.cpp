#include "rollout_pool/context_tracker.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "common/error.hpp"

namespace swarm {
namespace {

struct Timeline {
  Sample sample;
  int64_t last_extended = 0;  // index of the call that last extended it, for ties
};

bool is_prefix_of(const std::vector<TokenId>& prefix, const std::vector<TokenId>& seq) {
  return prefix.size() <= seq.size() && std::equal(prefix.begin(), prefix.end(), seq.begin());
}

// Appends `ids[from:]` as context (mask 0) to the timeline's sample.
void append_context(Sample& s, const std::vector<TokenId>& ids, size_t from) {
  for (size_t i = from; i < ids.size(); ++i) {
    s.token_ids.push_back(ids[i]);
    s.token_call.push_back(-1);
    s.loss_mask.push_back(0);
    s.rollout_logprobs.push_back(0.0f);
    s.policy_versions.push_back(-1);
  }
}

void append_completion(Sample& s, const LlmCall& call, int32_t call_in_sample) {
  for (size_t i = 0; i < call.completion_ids.size(); ++i) {
    s.token_ids.push_back(call.completion_ids[i]);
    s.token_call.push_back(call_in_sample);
    s.loss_mask.push_back(1);
    s.rollout_logprobs.push_back(call.completion_logprobs[i]);
    s.policy_versions.push_back(call.completion_versions.empty() ? call.policy_version
                                                                 : call.completion_versions[i]);
  }
}

}  // namespace

std::vector<Sample> merge_calls_into_samples(const std::vector<LlmCall>& calls) {
  std::vector<Timeline> timelines;
  std::map<std::string, int32_t> turns_of_agent;
  for (size_t c = 0; c < calls.size(); ++c) {
    const LlmCall& call = calls[c];
    SWARM_CHECK(call.completion_logprobs.size() == call.completion_ids.size(),
                "call " + std::to_string(c) + " has " + std::to_string(call.completion_logprobs.size()) +
                    " logprobs for " + std::to_string(call.completion_ids.size()) + " completion tokens");
    SWARM_CHECK(
        call.completion_versions.empty() || call.completion_versions.size() == call.completion_ids.size(),
        "call " + std::to_string(c) + " has " + std::to_string(call.completion_versions.size()) +
            " token versions for " + std::to_string(call.completion_ids.size()) + " completion tokens");

    Timeline* best = nullptr;
    for (Timeline& t : timelines) {
      if (!is_prefix_of(t.sample.token_ids, call.prompt_ids)) continue;
      if (best == nullptr || t.sample.token_ids.size() > best->sample.token_ids.size() ||
          (t.sample.token_ids.size() == best->sample.token_ids.size() &&
           t.last_extended > best->last_extended)) {
        best = &t;
      }
    }

    size_t from = 0;
    if (best == nullptr) {
      timelines.emplace_back();
      best = &timelines.back();
    } else {
      from = best->sample.token_ids.size();
    }
    append_context(best->sample, call.prompt_ids, from);
    best->sample.calls.push_back(
        {static_cast<int32_t>(c), call.agent, turns_of_agent[call.agent]++, call.temperature});
    append_completion(best->sample, call, static_cast<int32_t>(best->sample.calls.size() - 1));
    best->sample.num_calls += 1;
    best->last_extended = static_cast<int64_t>(c);
  }

  std::vector<Sample> out;
  out.reserve(timelines.size());
  for (Timeline& t : timelines) out.push_back(std::move(t.sample));
  return out;
}

}  // namespace swarm
