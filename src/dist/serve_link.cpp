// The serving link between rank 0 and a follower rank (see the header).
#include "dist/serve_link.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.hpp"
#include "grammar/grammar.hpp"
#include "grammar/lru_cache.hpp"

namespace swarm {
namespace {

using nlohmann::json;

// How often rank 0's reader looks at its requests' observers for a cancellation.
constexpr int kCancelPollMs = 10;

// ---- a little-endian binary writer and a bounds-checked reader for the payloads

class Writer {
 public:
  template <class T>
  void pod(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& s) {
    pod<uint32_t>(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  template <class T>
  void vec(const std::vector<T>& v) {
    pod<uint32_t>(static_cast<uint32_t>(v.size()));
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <class T>
  T pod() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  // A count of items of `item_bytes` each, never more than the bytes left could hold.
  uint32_t count(size_t item_bytes) {
    const auto n = pod<uint32_t>();
    need(static_cast<size_t>(n) * std::max<size_t>(item_bytes, 1));
    return n;
  }
  std::string str() {
    const uint32_t n = count(1);
    std::string s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  template <class T>
  std::vector<T> vec() {
    const uint32_t n = count(sizeof(T));
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  void finish() const {
    SWARM_REQUIRE(pos_ == in_.size(), ErrorKind::INVALID_ARGUMENT,
                  "serving link: trailing bytes in a message");
  }

 private:
  void need(size_t n) const {
    SWARM_REQUIRE(n <= in_.size() - pos_, ErrorKind::INVALID_ARGUMENT, "serving link: truncated message");
  }
  const std::string& in_;
  size_t pos_ = 0;
};

uint64_t id_of(const json& header) {
  const auto it = header.find("id");
  SWARM_REQUIRE(it != header.end() && it->is_number_unsigned(), ErrorKind::INVALID_ARGUMENT,
                "serving link: a message without a request id");
  return it->get<uint64_t>();
}

// Compiled grammars a follower received, by their bytes: requests with the same schema share
// one Grammar object, so the serving engine's mask cache for it stays warm.
class ReceivedGrammars {
 public:
  std::shared_ptr<const grammar::Grammar> get(const std::string& bytes) {
    std::lock_guard lk(mu_);
    if (auto g = cache_.find(bytes)) return g;
    grammar::Grammar g;
    try {
      g = grammar::Grammar::deserialize(bytes);
    } catch (const std::invalid_argument& e) {
      throw SwarmError(ErrorKind::INVALID_ARGUMENT, std::string("serving link: ") + e.what());
    }
    auto shared = std::make_shared<const grammar::Grammar>(std::move(g));
    return cache_.insert(bytes, shared, shared->memory_bytes());
  }

 private:
  std::mutex mu_;
  grammar::LruCache<std::string, grammar::Grammar> cache_{64, size_t{64} << 20};
};

ReceivedGrammars& received_grammars() {
  static ReceivedGrammars g;
  return g;
}

// Waits up to `ms` for fd to be readable (or closed): true when a read will not block.
bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  const int rc = ::poll(&p, 1, ms);
  if (rc < 0 && errno != EINTR)
    throw SwarmError(ErrorKind::UNAVAILABLE, std::string("poll failed: ") + std::strerror(errno));
  return rc > 0;
}

}  // namespace

// ------------------------------------------------------------------ wire forms

RankMessage encode_generate_request(uint64_t id, const GenerationRequest& request) {
  const SamplingParams& p = request.params;
  Writer w;
  w.vec(request.prompt_ids);
  w.pod(p.temperature);
  w.pod(p.top_p);
  w.pod(p.top_k);
  w.pod(p.max_tokens);
  w.pod<uint8_t>(p.seed.has_value());
  w.pod<uint64_t>(p.seed.value_or(0));
  w.pod<uint32_t>(static_cast<uint32_t>(p.stop.size()));
  for (const std::string& s : p.stop) w.str(s);
  w.vec(p.stop_token_ids);
  w.pod(p.n);
  w.pod<uint8_t>(p.logprobs);
  w.pod(p.top_logprobs);
  w.pod<uint8_t>(request.grammar != nullptr);
  if (request.grammar) w.str(request.grammar->serialize());
  return RankMessage{json{{"kind", "generate"}, {"id", id}}, w.take()};
}

GenerationRequest decode_generate_request(const RankMessage& message) {
  Reader r(message.payload);
  GenerationRequest request;
  SamplingParams& p = request.params;
  request.prompt_ids = r.vec<TokenId>();
  p.temperature = r.pod<double>();
  p.top_p = r.pod<double>();
  p.top_k = r.pod<int64_t>();
  p.max_tokens = r.pod<int64_t>();
  const bool has_seed = r.pod<uint8_t>() != 0;
  const auto seed = r.pod<uint64_t>();
  if (has_seed) p.seed = seed;
  const uint32_t stops = r.count(4);
  for (uint32_t i = 0; i < stops; ++i) p.stop.push_back(r.str());
  p.stop_token_ids = r.vec<TokenId>();
  p.n = r.pod<int64_t>();
  p.logprobs = r.pod<uint8_t>() != 0;
  p.top_logprobs = r.pod<int64_t>();
  if (r.pod<uint8_t>() != 0) request.grammar = received_grammars().get(r.str());
  r.finish();
  return request;
}

std::string encode_generation_result(const GenerationResult& result, json& header) {
  Writer w;
  w.pod(result.policy_version);
  w.pod<uint32_t>(static_cast<uint32_t>(result.choices.size()));
  for (const GenerationChoice& c : result.choices) {
    w.vec(c.ids);
    w.vec(c.logprobs);
    w.vec(c.versions);
    w.pod<uint32_t>(static_cast<uint32_t>(c.top.size()));
    for (const auto& position : c.top) {
      w.pod<uint32_t>(static_cast<uint32_t>(position.size()));
      for (const TokenAlternative& a : position) {
        w.pod(a.id);
        w.pod(a.logprob);
      }
    }
    w.str(c.text);
    w.str(c.finish_reason);
  }
  header["kind"] = "done";
  return w.take();
}

GenerationResult decode_generation_result(const json& header, const std::string& payload) {
  (void)header;
  Reader r(payload);
  GenerationResult result;
  result.policy_version = r.pod<int64_t>();
  const uint32_t choices = r.count(size_t{4} * 6);
  for (uint32_t i = 0; i < choices; ++i) {
    GenerationChoice& c = result.choices.emplace_back();
    c.ids = r.vec<TokenId>();
    c.logprobs = r.vec<float>();
    c.versions = r.vec<int64_t>();
    const uint32_t positions = r.count(4);
    for (uint32_t k = 0; k < positions; ++k) {
      auto& alternatives = c.top.emplace_back(r.count(8));
      for (TokenAlternative& a : alternatives) {
        a.id = r.pod<TokenId>();
        a.logprob = r.pod<float>();
      }
    }
    c.text = r.str();
    c.finish_reason = r.str();
  }
  r.finish();
  return result;
}

// ------------------------------------------------------------------ rank 0's end

ServeLinkLeader::ServeLinkLeader(int fd, int rank, std::function<void(const std::string&)> on_broken)
    : rank_(rank), fd_(fd), on_broken_(std::move(on_broken)) {
  reader_ = std::thread([this] { read_loop(); });
}

ServeLinkLeader::~ServeLinkLeader() {
  close("the engine was stopped");
  if (reader_.joinable()) reader_.join();
  ::close(fd_);
}

void ServeLinkLeader::close(const std::string& reason) {
  stopping_ = true;
  ::shutdown(fd_, SHUT_RDWR);  // the reader sees the end and fails what is in flight
  fail_all(reason);
}

std::string ServeLinkLeader::broken() const {
  std::lock_guard lk(mu_);
  return broken_;
}

void ServeLinkLeader::send(const RankMessage& message) {
  std::lock_guard lk(write_mu_);
  write_rank_frame(fd_, message);
}

void ServeLinkLeader::submit(const GenerationRequest& request,
                             const std::shared_ptr<GenerationObserver>& observer) {
  uint64_t id = 0;
  {
    std::lock_guard lk(mu_);
    if (!broken_.empty()) {
      const std::string why = broken_;
      return observer->on_error(ErrorKind::UNAVAILABLE,
                                "rank " + std::to_string(rank_) + " is not serving: " + why);
    }
    id = next_id_++;
    pending_[id] = Pending{observer, false};
  }
  try {
    send(encode_generate_request(id, request));
  } catch (const std::exception& e) {
    const std::string why = std::string("sending a request failed: ") + e.what();
    fail_all(why);  // includes this one
  }
}

void ServeLinkLeader::set_policy_version(int64_t version) {
  try {
    send(RankMessage{json{{"kind", "version"}, {"version", version}}, {}});
  } catch (const std::exception& e) {
    fail_all(std::string("sending the policy version failed: ") + e.what());
  }
}

std::shared_ptr<GenerationObserver> ServeLinkLeader::find(uint64_t id) {
  std::lock_guard lk(mu_);
  auto it = pending_.find(id);
  return it == pending_.end() ? nullptr : it->second.observer;
}

std::shared_ptr<GenerationObserver> ServeLinkLeader::take(uint64_t id) {
  std::lock_guard lk(mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return nullptr;
  auto observer = std::move(it->second.observer);
  pending_.erase(it);
  return observer;
}

void ServeLinkLeader::fail_all(const std::string& why) {
  std::map<uint64_t, Pending> failed;
  bool first = false;
  {
    std::lock_guard lk(mu_);
    if (broken_.empty()) {
      broken_ = why;
      first = true;
    }
    failed.swap(pending_);
  }
  // Told first, so that a client retrying the failed request is routed elsewhere.
  if (first && !stopping_) {
    spdlog::error("serving link: rank {} stopped serving: {}", rank_, why);
    if (on_broken_) on_broken_(why);
  }
  const std::string message = "rank " + std::to_string(rank_) + " stopped serving: " + why;
  for (auto& [id, p] : failed) {
    try {
      p.observer->on_error(ErrorKind::UNAVAILABLE, message);
    } catch (const std::exception& e) {
      spdlog::error("serving link to rank {}: an observer threw: {}", rank_, e.what());
    }
  }
}

void ServeLinkLeader::read_loop() {
  std::string why = "the engine was stopped";
  try {
    for (;;) {
      // Cancellations first: a client that went away frees the follower's KV cache.
      std::vector<uint64_t> cancel;
      {
        std::lock_guard lk(mu_);
        for (auto& [id, p] : pending_) {
          if (p.cancel_sent) continue;
          bool gone = false;
          try {
            gone = p.observer->cancelled();
          } catch (const std::exception&) {
            gone = true;
          }
          if (gone) p.cancel_sent = true, cancel.push_back(id);
        }
      }
      for (uint64_t id : cancel) send(RankMessage{json{{"kind", "cancel"}, {"id", id}}, {}});
      if (!readable_within(fd_, kCancelPollMs)) continue;
      std::optional<RankMessage> m = read_rank_frame(fd_);
      if (!m) {
        why = stopping_ ? "the engine was stopped" : "its serving link closed (has the process exited?)";
        break;
      }
      const std::string kind = m->header.value("kind", "");
      const uint64_t id = id_of(m->header);
      if (kind == "text") {
        if (auto o = find(id)) o->on_text(m->header.at("choice").get<int64_t>(), m->payload);
      } else if (kind == "done") {
        GenerationResult result = decode_generation_result(m->header, m->payload);
        if (auto o = take(id)) o->on_complete(std::move(result));
      } else if (kind == "error") {
        const int k = m->header.value("error_kind", static_cast<int>(ErrorKind::INTERNAL));
        const ErrorKind error_kind = k >= 0 && k <= static_cast<int>(ErrorKind::INTERNAL)
                                         ? static_cast<ErrorKind>(k)
                                         : ErrorKind::INTERNAL;
        if (auto o = take(id)) o->on_error(error_kind, m->header.value("message", std::string()));
      } else {
        throw SwarmError(ErrorKind::INVALID_ARGUMENT, "serving link: unknown message '" + kind + "'");
      }
    }
  } catch (const std::exception& e) {
    why = stopping_ ? "the engine was stopped" : e.what();
  }
  fail_all(why);
}

// ------------------------------------------------------------------ a follower's end

// Carries one request's observer calls back to rank 0. Its engine may call it after the link
// is gone (the link's destructor does not wait for the engine): the sends then do nothing.
class ServeLinkFollower::Remote final : public GenerationObserver {
 public:
  Remote(ServeLinkFollower* link, uint64_t id) : link_(link), id_(id) {}
  void on_text(int64_t choice, const std::string& delta) override {
    send(RankMessage{json{{"kind", "text"}, {"id", id_}, {"choice", choice}}, delta});
  }
  void on_complete(GenerationResult result) override {
    json header{{"id", id_}};
    std::string payload = encode_generation_result(result, header);
    send(RankMessage{std::move(header), std::move(payload)});
    forget();
  }
  void on_error(ErrorKind kind, const std::string& message) override {
    send(RankMessage{
        json{{"kind", "error"}, {"id", id_}, {"error_kind", static_cast<int>(kind)}, {"message", message}},
        {}});
    forget();
  }
  bool cancelled() const override { return cancelled_.load(); }
  void cancel() { cancelled_ = true; }
  void detach() {
    std::lock_guard lk(mu_);
    link_ = nullptr;
    cancelled_ = true;
  }

 private:
  void send(const RankMessage& m) {
    std::lock_guard lk(mu_);
    if (link_) link_->send(m);
  }
  void forget() {
    std::lock_guard lk(mu_);
    if (!link_) return;
    std::lock_guard live(link_->mu_);
    link_->live_.erase(id_);
  }
  std::mutex mu_;  // link_ (the link detaches every remote before it goes)
  ServeLinkFollower* link_;
  const uint64_t id_;
  std::atomic<bool> cancelled_{false};
};

ServeLinkFollower::ServeLinkFollower(int fd, int rank, Submit submit,
                                     std::function<void(int64_t)> set_policy_version)
    : rank_(rank), fd_(fd), submit_(std::move(submit)), set_policy_version_(std::move(set_policy_version)) {
  reader_ = std::thread([this] { read_loop(); });
}

ServeLinkFollower::~ServeLinkFollower() {
  stopping_ = true;
  ::shutdown(fd_, SHUT_RDWR);
  if (reader_.joinable()) reader_.join();
  std::map<uint64_t, std::weak_ptr<Remote>> live;
  {
    std::lock_guard lk(mu_);
    live.swap(live_);
  }
  for (auto& [id, weak] : live)
    if (auto r = weak.lock()) r->detach();
  ::close(fd_);
}

void ServeLinkFollower::send(const RankMessage& message) {
  std::lock_guard lk(write_mu_);
  if (write_failed_) return;
  try {
    write_rank_frame(fd_, message);
  } catch (const std::exception& e) {
    write_failed_ = true;
    if (!stopping_) spdlog::error("rank {}: the serving link to rank 0 broke: {}", rank_, e.what());
  }
}

void ServeLinkFollower::read_loop() {
  try {
    while (std::optional<RankMessage> m = read_rank_frame(fd_)) {
      const std::string kind = m->header.value("kind", "");
      if (kind == "version") {
        set_policy_version_(m->header.at("version").get<int64_t>());
        continue;
      }
      const uint64_t id = id_of(m->header);
      if (kind == "cancel") {
        std::shared_ptr<Remote> r;
        {
          std::lock_guard lk(mu_);
          if (auto it = live_.find(id); it != live_.end()) r = it->second.lock();
        }
        if (r) r->cancel();
        continue;
      }
      SWARM_REQUIRE(kind == "generate", ErrorKind::INVALID_ARGUMENT,
                    "serving link: unknown message '" + kind + "' from rank 0");
      auto remote = std::make_shared<Remote>(this, id);
      {
        std::lock_guard lk(mu_);
        live_[id] = remote;
      }
      ++requests_;
      GenerationRequest request;
      try {
        request = decode_generate_request(*m);
      } catch (const SwarmError& e) {
        remote->on_error(e.kind(), e.what());
        continue;
      }
      submit_(std::move(request), remote);
    }
  } catch (const std::exception& e) {
    if (!stopping_) spdlog::error("rank {}: the serving link from rank 0 failed: {}", rank_, e.what());
  }
  // Rank 0 is gone or closed the link: what runs here is for nobody.
  std::lock_guard lk(mu_);
  for (auto& [id, weak] : live_)
    if (auto r = weak.lock()) r->cancel();
}

}  // namespace swarm
