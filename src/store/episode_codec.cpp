#include "store/episode_codec.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "common/error.hpp"

namespace swarm {
namespace {

static_assert(std::endian::native == std::endian::little, "the episode record is little-endian");

constexpr char kMagic[4] = {'S', 'W', 'E', 'P'};
// Version 2 added each call's temperature (SampleCall::temperature); version 1 records (written
// before) are read with temperature 1, what their log-probs were recorded under unless the run
// sampled at another temperature.
constexpr uint32_t kVersion = 2;
constexpr uint32_t kOldestVersion = 1;

class Writer {
 public:
  template <class T>
  void pod(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    pod(static_cast<uint64_t>(s.size()));
    out_ += s;
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    pod(static_cast<uint64_t>(v.size()));
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void raw(const char* p, size_t n) { out_.append(p, n); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <class T>
  T pod(const char* what) {
    T v;
    need(sizeof v, what);
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string str(const char* what) {
    const uint64_t n = pod<uint64_t>(what);
    need(n, what);
    std::string s(in_.substr(at_, n));
    at_ += n;
    return s;
  }
  template <class T>
  std::vector<T> vec(const char* what) {
    const uint64_t n = pod<uint64_t>(what);
    if (n > (in_.size() - at_) / sizeof(T)) fail(std::string(what) + " is longer than the record");
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), in_.data() + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return v;
  }
  uint64_t count(const char* what, size_t min_bytes_each) {
    const uint64_t n = pod<uint64_t>(what);
    if (min_bytes_each > 0 && n > (in_.size() - at_) / min_bytes_each)
      fail(std::string(what) + " is longer than the record");
    return n;
  }
  void expect_magic() {
    need(sizeof kMagic, "magic");
    if (std::memcmp(in_.data(), kMagic, sizeof kMagic) != 0) fail("it does not start with SWEP");
    at_ += sizeof kMagic;
  }
  bool done() const { return at_ == in_.size(); }
  [[noreturn]] void fail(const std::string& why) const {
    throw SwarmError(ErrorKind::INTERNAL,
                     "corrupt episode record (" + std::to_string(in_.size()) + " bytes): " + why);
  }

 private:
  void need(uint64_t n, const char* what) const {
    if (n > in_.size() - at_) fail(std::string("truncated in ") + what);
  }
  std::string_view in_;
  size_t at_ = 0;
};

}  // namespace

// Every field is written: the structured bindings name each member of FinishedEpisode, Sample
// and SampleCall, so a field added to one of them stops this from compiling until it is encoded
// here (and decoded below). The rank channel and the episode store both use this encoding.
std::string encode_finished_episode(const FinishedEpisode& e) {
  const auto& [episode_uuid, client_uuid, task_id, reward, is_success, log_metrics, optional_task_id, samples,
               turn_rewards, finish_seq, min_version, exchange_calls, metadata_json, task_metadata_json,
               from_node] = e;
  Writer w;
  w.raw(kMagic, sizeof kMagic);
  w.pod(kVersion);
  w.str(episode_uuid);
  w.str(client_uuid);
  w.str(task_id);
  w.pod(reward);
  w.pod(static_cast<int8_t>(is_success ? (*is_success ? 1 : 0) : -1));
  w.pod(static_cast<uint64_t>(log_metrics.size()));
  for (const auto& [k, v] : log_metrics) {
    w.str(k);
    w.pod(v);
  }
  w.str(optional_task_id);
  w.pod(static_cast<uint64_t>(samples.size()));
  for (const Sample& s : samples) {
    const auto& [s_task_id, s_episode_uuid, s_reward, token_ids, loss_mask, rollout_logprobs, policy_versions,
                 num_calls, calls, token_call, token_rewards] = s;
    w.str(s_task_id);
    w.str(s_episode_uuid);
    w.pod(s_reward);
    w.vec(token_ids);
    w.vec(loss_mask);
    w.vec(rollout_logprobs);
    w.vec(policy_versions);
    w.pod(static_cast<int64_t>(num_calls));
    w.pod(static_cast<uint64_t>(calls.size()));
    for (const SampleCall& c : calls) {
      const auto& [index, agent, turn, temperature] = c;
      w.pod(index);
      w.str(agent);
      w.pod(turn);
      w.pod(temperature);
    }
    w.vec(token_call);
    w.vec(token_rewards);
  }
  w.vec(turn_rewards);
  w.pod(finish_seq);
  w.pod(min_version);
  w.pod(static_cast<uint64_t>(exchange_calls.size()));
  for (const std::string& c : exchange_calls) w.str(c);
  w.str(metadata_json);
  w.str(task_metadata_json);
  w.str(from_node);
  return w.take();
}

FinishedEpisode decode_finished_episode(std::string_view bytes) {
  Reader r(bytes);
  r.expect_magic();
  const auto version = r.pod<uint32_t>("version");
  if (version < kOldestVersion || version > kVersion)
    r.fail("format version " + std::to_string(version) + " (this build reads " +
           std::to_string(kOldestVersion) + " to " + std::to_string(kVersion) + ")");
  FinishedEpisode e;
  e.episode_uuid = r.str("episode_uuid");
  e.client_uuid = r.str("client_uuid");
  e.task_id = r.str("task_id");
  e.reward = r.pod<double>("reward");
  const auto success = r.pod<int8_t>("is_success");
  if (success < -1 || success > 1) r.fail("is_success is " + std::to_string(success));
  if (success >= 0) e.is_success = success == 1;
  for (uint64_t n = r.count("log_metrics", 16); n > 0; --n) {
    std::string k = r.str("log_metrics key");
    e.log_metrics[std::move(k)] = r.pod<double>("log_metrics value");
  }
  e.optional_task_id = r.str("optional_task_id");
  const uint64_t n_samples = r.count("samples", uint64_t{8} * 9);
  e.samples.reserve(n_samples);
  for (uint64_t i = 0; i < n_samples; ++i) {
    Sample s;
    s.task_id = r.str("sample task_id");
    s.episode_uuid = r.str("sample episode_uuid");
    s.reward = r.pod<double>("sample reward");
    s.token_ids = r.vec<TokenId>("token_ids");
    s.loss_mask = r.vec<uint8_t>("loss_mask");
    s.rollout_logprobs = r.vec<float>("rollout_logprobs");
    s.policy_versions = r.vec<int64_t>("policy_versions");
    s.num_calls = static_cast<int>(r.pod<int64_t>("num_calls"));
    const uint64_t n_calls = r.count("calls", 16);
    s.calls.reserve(n_calls);
    for (uint64_t c = 0; c < n_calls; ++c) {
      SampleCall call;
      call.index = r.pod<int32_t>("call index");
      call.agent = r.str("call agent");
      call.turn = r.pod<int32_t>("call turn");
      if (version >= 2) {
        call.temperature = r.pod<float>("call temperature");
        if (!(call.temperature > 0.0f) || !std::isfinite(call.temperature))
          r.fail("call " + std::to_string(c) + " has temperature " + std::to_string(call.temperature));
      }
      s.calls.push_back(std::move(call));
    }
    s.token_call = r.vec<int32_t>("token_call");
    s.token_rewards = r.vec<float>("token_rewards");
    const size_t n = s.token_ids.size();
    if (s.loss_mask.size() != n || s.rollout_logprobs.size() != n || s.policy_versions.size() != n ||
        s.token_call.size() != n || (!s.token_rewards.empty() && s.token_rewards.size() != n))
      r.fail("sample " + std::to_string(i) + " has per-token lists of different lengths");
    for (int32_t k : s.token_call)
      if (k < -1 || k >= static_cast<int64_t>(s.calls.size()))
        r.fail("sample " + std::to_string(i) + " names call " + std::to_string(k) + " of " +
               std::to_string(s.calls.size()));
    e.samples.push_back(std::move(s));
  }
  e.turn_rewards = r.vec<double>("turn_rewards");
  e.finish_seq = r.pod<int64_t>("finish_seq");
  e.min_version = r.pod<int64_t>("min_version");
  for (uint64_t n = r.count("exchange_calls", 8); n > 0; --n)
    e.exchange_calls.push_back(r.str("exchange call"));
  e.metadata_json = r.str("metadata_json");
  e.task_metadata_json = r.str("task_metadata_json");
  e.from_node = r.str("from_node");
  if (!r.done()) r.fail("bytes left after the episode");
  return e;
}

}  // namespace swarm
