#include "exchange/exchange.hpp"

#include <fmt/format.h>
#include <nats/nats.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <map>
#include <unordered_set>

namespace swarm {

namespace {

double system_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string nats_error(natsStatus s, jsErrCode jerr = static_cast<jsErrCode>(0)) {
  std::string text = natsStatus_GetText(s);
  const char* last = nats_GetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(": ") + last;
  if (jerr != 0) text += " (JetStream error " + std::to_string(static_cast<int>(jerr)) + ")";
  return text;
}

constexpr const char* kOtherPeers = "(other)";
constexpr int64_t kNanosPerSecond = 1000000000;

// A consumer's start time as nats.c sends it meant. nats.c (3.4.1, and still so at its HEAD)
// writes the fraction of a second without its leading zeros: .05 s goes out as .5 s, so a start
// time early in its second would start up to 0.9 s late and skip what was stored in between. A
// fraction under 0.1 s is rounded down to the whole second (written exactly); the messages that
// replays are skipped by their stream time (Impl::resume_after_ns).
int64_t nats_exact_start_time(int64_t ns) {
  const int64_t frac = ns % kNanosPerSecond;
  return frac > 0 && frac < kNanosPerSecond / 10 ? ns - frac : ns;
}

// How long a consumer may deliver nothing before the node asks the broker whether it is still
// there (an operator may delete it, or the broker drop it, without the fetches failing).
constexpr auto kConsumerCheckInterval = std::chrono::seconds(10);

}  // namespace

std::string redact_url(const std::string& url) {
  const auto scheme = url.find("://");
  const auto at = url.find('@', scheme == std::string::npos ? 0 : scheme + 3);
  if (scheme == std::string::npos || at == std::string::npos) return url;
  return url.substr(0, scheme + 3) + "***@" + url.substr(at + 1);
}

struct Exchange::Impl {
  explicit Impl(Exchange& owner) : self(owner) {}

  Exchange& self;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool stopping = false;
  std::thread worker;

  // Guarded by mu.
  struct Outgoing {
    std::string id, payload;
  };
  std::deque<Outgoing> outbox;
  struct Buffered {
    SapoGroup group;
  };
  std::deque<Buffered> buffer;
  // The ids of the groups accepted lately (sapo_message_id of their fields), for de-duplication;
  // bounded.
  std::deque<std::string> recent_ids;
  std::unordered_set<std::string> recent_set;
  ExchangeStatus st;

  // The worker's own (no lock).
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  natsSubscription* sub = nullptr;
  bool was_connected = false;
  bool ever_connected = false;
  int64_t last_time_ns = 0;     // the newest message's stream time (a new consumer resumes after it)
  int64_t resume_after_ns = 0;  // messages at or before this stream time were handled: skipped
  int publish_attempts = 0;     // failed tries of the outbox's first message while connected
  bool stream_checked = false;  // its limits compared with ours once
  int fetch_errors = 0;
  std::chrono::steady_clock::time_point consumer_checked;  // the last sign the consumer is there

  double now() const { return self.config_.now ? self.config_.now() : system_now(); }

  void set_error(const std::string& e) {
    std::lock_guard lk(mu);
    if (st.last_error != e) spdlog::warn("exchange: {} (training goes on with local groups)", e);
    st.last_error = e;
  }

  ExchangePeer& peer_locked(const std::string& node) {
    auto it = st.peers.find(node);
    if (it != st.peers.end()) return it->second;
    if (static_cast<int64_t>(st.peers.size()) >= self.config_.max_peers_tracked) return st.peers[kOtherPeers];
    return st.peers[node];
  }

  void drop_locked(SapoDrop d, ExchangePeer* peer) {
    ++st.dropped[sapo_drop_name(d)];
    if (peer != nullptr && d != SapoDrop::OWN) ++peer->dropped;
  }

  // ------------------------------------------------------------------ the worker thread

  void run() {
    while (true) {
      {
        std::lock_guard lk(mu);
        if (stopping) break;
      }
      if (nc == nullptr && !connect()) {
        wait_for(std::chrono::milliseconds(1000));
        continue;
      }
      const bool connected = natsConnection_Status(nc) == NATS_CONN_STATUS_CONNECTED;
      if (connected != was_connected) {
        {
          std::lock_guard lk(mu);
          st.connected = connected;
          if (!connected) st.ready = false;
        }
        if (connected && ever_connected) {
          std::lock_guard lk(mu);
          ++st.reconnects;
        }
        if (connected)
          spdlog::info("exchange: {} to {} as node {}", ever_connected ? "reconnected" : "connected",
                       redact_url(self.config_.url), self.config_.node_id);
        else
          set_error("lost the broker at " + redact_url(self.config_.url) + "; reconnecting");
        was_connected = connected;
        ever_connected = ever_connected || connected;
        drop_subscription();  // a fresh consumer after every reconnect (the broker may have lost it)
      }
      if (!connected) {
        wait_for(std::chrono::milliseconds(200));
        continue;
      }
      if (!ready() && !setup()) {
        wait_for(std::chrono::milliseconds(1000));
        continue;
      }
      publish_outbox();
      if (sub != nullptr)
        fetch();
      else
        wait_for(std::chrono::milliseconds(200));
    }
    drop_subscription();
    if (js != nullptr) jsCtx_Destroy(js);
    if (nc != nullptr) {
      natsConnection_Close(nc);
      natsConnection_Destroy(nc);
    }
    js = nullptr;
    nc = nullptr;
  }

  void wait_for(std::chrono::milliseconds d) {
    std::unique_lock lk(mu);
    cv.wait_for(lk, d, [this] { return stopping; });
  }

  bool ready() {
    std::lock_guard lk(mu);
    return st.ready;
  }

  bool connect() {
    natsOptions* opts = nullptr;
    natsStatus s = natsOptions_Create(&opts);
    const ExchangeConfig& c = self.config_;
    const std::string name = "swarm-server " + c.node_id;
    if (s == NATS_OK) s = natsOptions_SetURL(opts, c.url.c_str());
    if (s == NATS_OK) s = natsOptions_SetName(opts, name.c_str());
    // tls:// means TLS whatever the broker offers (the client would otherwise follow the broker).
    if (s == NATS_OK && c.url.rfind("tls://", 0) == 0) s = natsOptions_SetSecure(opts, true);
    if (s == NATS_OK && !c.credentials_file.empty())
      s = natsOptions_SetUserCredentialsFromFiles(opts, c.credentials_file.c_str(), nullptr);
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts, -1);
    if (s == NATS_OK) s = natsOptions_SetReconnectWait(opts, 500);
    if (s == NATS_OK) s = natsOptions_SetTimeout(opts, 2000);
    // A broker away at boot: the library keeps trying in the background, as after a loss.
    if (s == NATS_OK) s = natsOptions_SetRetryOnFailedConnect(opts, true, nullptr, nullptr);
    if (s == NATS_OK) {
      s = natsConnection_Connect(&nc, opts);
      if (s == NATS_NOT_YET_CONNECTED) s = NATS_OK;
    }
    std::string error;
    if (s != NATS_OK) error = "cannot connect to " + redact_url(c.url) + ": " + nats_error(s);
    natsOptions_Destroy(opts);
    if (s == NATS_OK) {
      jsOptions jo;
      jsOptions_Init(&jo);
      jo.Wait = 3000;
      s = natsConnection_JetStream(&js, nc, &jo);
      if (s != NATS_OK) error = "JetStream context: " + nats_error(s);
    }
    if (s != NATS_OK) {
      if (nc != nullptr) natsConnection_Destroy(nc);
      nc = nullptr;
      set_error(error);
      return false;
    }
    return true;
  }

  // The stream (made when missing; one an operator made is used as it is) and the consumer.
  bool setup() {
    const ExchangeConfig& c = self.config_;
    const std::string stream = self.stream_name();
    const std::string subjects = "swarm." + c.swarm_name + ".groups.*";
    jsStreamInfo* si = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_GetStreamInfo(&si, js, stream.c_str(), nullptr, &jerr);
    if (s == NATS_NOT_FOUND) {
      jsStreamConfig sc;
      jsStreamConfig_Init(&sc);
      const char* subj[] = {subjects.c_str()};
      sc.Name = stream.c_str();
      sc.Subjects = subj;
      sc.SubjectsLen = 1;
      sc.Retention = js_LimitsPolicy;
      sc.Storage = js_FileStorage;
      sc.Discard = js_DiscardOld;
      sc.MaxAge = static_cast<int64_t>(c.max_age_seconds * 1e9);
      sc.MaxBytes = c.stream_max_bytes;
      sc.MaxMsgsPerSubject = c.max_msgs_per_node;
      sc.MaxMsgSize = static_cast<int32_t>(c.max_message_bytes);
      sc.Duplicates = int64_t{120} * 1000000000;  // the Nats-Msg-Id window
      jerr = static_cast<jsErrCode>(0);
      s = js_AddStream(&si, js, &sc, nullptr, &jerr);
      if (s == NATS_OK)
        spdlog::info("exchange: created stream {} ({}; max age {:.0f}s, {} messages per node)", stream,
                     subjects, c.max_age_seconds, c.max_msgs_per_node);
    }
    if (s == NATS_OK && si != nullptr && si->Config != nullptr && !stream_checked) {
      stream_checked = true;
      const int64_t ours = static_cast<int64_t>(c.max_age_seconds * 1e9);
      if (si->Config->MaxAge != ours)
        spdlog::info(
            "exchange: stream {} keeps messages {} (its maker's setting; exchange_max_age_seconds here is "
            "{:.0f}s)",
            stream,
            si->Config->MaxAge > 0 ? fmt::format("{:.0f}s", si->Config->MaxAge / 1e9)
                                   : "without an age limit",
            c.max_age_seconds);
    }
    if (si != nullptr) jsStreamInfo_Destroy(si);
    if (s != NATS_OK) {
      set_error("stream " + stream + ": " + nats_error(s, jerr));
      return false;
    }
    if (c.consume && sub == nullptr) {
      jsSubOptions so;
      jsSubOptions_Init(&so);
      so.Stream = stream.c_str();
      so.Config.AckPolicy = js_AckExplicit;
      so.Config.InactiveThreshold = int64_t{300} * 1000000000;
      // By time, not sequence: a broker that lost its store numbers from 1 again. The first
      // consumer replays the window (a late joiner gets it too); later ones resume after the
      // newest message handled (ids seen lately are dropped as duplicates).
      so.Config.DeliverPolicy = js_DeliverByStartTime;
      so.Config.OptStartTime = nats_exact_start_time(
          last_time_ns > 0 ? last_time_ns + 1 : static_cast<int64_t>((now() - c.max_age_seconds) * 1e9));
      resume_after_ns = last_time_ns;
      consumer_checked = std::chrono::steady_clock::now();
      jerr = static_cast<jsErrCode>(0);
      s = js_PullSubscribe(&sub, js, subjects.c_str(), nullptr, nullptr, &so, &jerr);
      if (s != NATS_OK) {
        sub = nullptr;
        set_error("consumer on " + stream + ": " + nats_error(s, jerr));
        return false;
      }
    }
    std::lock_guard lk(mu);
    st.ready = true;
    st.last_error.clear();
    return true;
  }

  void drop_subscription() {
    if (sub != nullptr) {
      natsSubscription_Unsubscribe(sub);
      natsSubscription_Destroy(sub);
      sub = nullptr;
    }
    std::lock_guard lk(mu);
    st.ready = false;
  }

  // Whether the broker says this node's consumer no longer exists (deleted by an operator,
  // dropped after inactivity, or lost with the broker's store). Other answers (a timeout while
  // the broker is busy) keep it. Either way the check counts as a sign of life.
  bool consumer_gone() {
    consumer_checked = std::chrono::steady_clock::now();
    jsConsumerInfo* ci = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    const natsStatus s = natsSubscription_GetConsumerInfo(&ci, sub, nullptr, &jerr);
    if (ci != nullptr) jsConsumerInfo_Destroy(ci);
    const bool gone = s == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr;
    if (gone) set_error("the consumer on " + self.stream_name() + " is gone; making it again");
    return gone;
  }

  void publish_outbox() {
    while (true) {
      Outgoing out;
      {
        std::lock_guard lk(mu);
        if (outbox.empty() || stopping) return;
        out = outbox.front();
      }
      natsMsg* msg = nullptr;
      const std::string subject = self.subject();
      natsStatus s = natsMsg_Create(&msg, subject.c_str(), nullptr, out.payload.data(),
                                    static_cast<int>(out.payload.size()));
      if (s == NATS_OK) s = natsMsgHeader_Set(msg, "Nats-Msg-Id", out.id.c_str());
      jsPubOptions po;
      jsPubOptions_Init(&po);
      po.MaxWait = 3000;
      jsPubAck* ack = nullptr;
      jsErrCode jerr = static_cast<jsErrCode>(0);
      if (s == NATS_OK) s = js_PublishMsg(&ack, js, msg, &po, &jerr);
      const bool duplicate = ack != nullptr && ack->Duplicate;
      if (ack != nullptr) jsPubAck_Destroy(ack);
      if (msg != nullptr) natsMsg_Destroy(msg);
      if (s != NATS_OK) {
        // A message the broker will never take (over its max_payload or the stream's message
        // size), or one refused again and again while connected, is dropped and counted, not
        // retried forever in front of the others.
        const bool permanent = s == NATS_MAX_PAYLOAD || static_cast<int>(jerr) == 10054;
        const bool give_up = permanent || ++publish_attempts >= 5;
        {
          std::lock_guard lk(mu);
          ++st.publish_errors;
          if (give_up && !outbox.empty() && outbox.front().id == out.id) {
            outbox.pop_front();
            ++(permanent ? st.publish_too_large : st.outbox_dropped);
          }
        }
        if (give_up) publish_attempts = 0;
        set_error("publishing to " + subject + ": " + nats_error(s, jerr) + (give_up ? " (dropped)" : ""));
        // The stream gone (a broker restarted without its store): make it again.
        if (s == NATS_NOT_FOUND || s == NATS_NO_RESPONDERS) drop_subscription();
        return;  // otherwise kept in the outbox; tried again on the next round
      }
      publish_attempts = 0;
      std::lock_guard lk(mu);
      if (!outbox.empty() && outbox.front().id == out.id) outbox.pop_front();
      ++st.published;
      if (duplicate) ++st.publish_duplicates;
      st.last_error.clear();
    }
  }

  void fetch() {
    natsMsgList list{nullptr, 0};
    jsErrCode jerr = static_cast<jsErrCode>(0);
    const natsStatus s = natsSubscription_Fetch(&list, sub, 64, 250, &jerr);
    if (s == NATS_TIMEOUT) {
      fetch_errors = 0;
      // Nothing for a while: is the consumer still there? (A deleted one answers the pull that
      // was waiting with an error once, then every later fetch only times out.)
      if (std::chrono::steady_clock::now() - consumer_checked >= kConsumerCheckInterval && consumer_gone())
        drop_subscription();  // made again by setup()
      return;
    }
    if (s != NATS_OK) {
      natsMsgList_Destroy(&list);
      set_error("fetching from " + self.stream_name() + ": " + nats_error(s, jerr));
      if (++fetch_errors >= 3 || consumer_gone()) {
        fetch_errors = 0;
        drop_subscription();  // made again by setup()
      }
      wait_for(std::chrono::milliseconds(200));
      return;
    }
    fetch_errors = 0;
    consumer_checked = std::chrono::steady_clock::now();
    for (int i = 0; i < list.Count; ++i) {
      natsMsg* m = list.Msgs[i];
      int64_t stream_time = 0;
      jsMsgMetaData* meta = nullptr;
      if (natsMsg_GetMetaData(&meta, m) == NATS_OK && meta != nullptr) {
        stream_time = meta->Timestamp;
        jsMsgMetaData_Destroy(meta);
      }
      if (stream_time > 0 && stream_time <= resume_after_ns) {  // replayed by a rounded start time
        natsMsg_Ack(m, nullptr);
        continue;
      }
      last_time_ns = std::max(last_time_ns, stream_time);
      const char* id = nullptr;
      std::string msg_id;
      if (natsMsgHeader_Get(m, "Nats-Msg-Id", &id) == NATS_OK && id != nullptr) msg_id = id;
      const char* data = natsMsg_GetData(m);
      const int len = natsMsg_GetDataLength(m);
      self.receive(natsMsg_GetSubject(m),
                   std::string_view(data == nullptr ? "" : data, static_cast<size_t>(std::max(0, len))),
                   msg_id);
      natsMsg_Ack(m, nullptr);
    }
    natsMsgList_Destroy(&list);
  }
};

Exchange::Exchange(ExchangeConfig config) : config_(std::move(config)), impl_(std::make_unique<Impl>(*this)) {
  std::random_device rd;
  char run[9];
  std::snprintf(run, sizeof run, "%08x", rd());
  run_id_ = run;
  impl_->st.url = redact_url(config_.url);
  impl_->st.node_id = config_.node_id;
  impl_->st.swarm_name = config_.swarm_name;
  impl_->st.stream = stream_name();
  if (!config_.url.empty()) impl_->worker = std::thread([this] { impl_->run(); });
}

Exchange::~Exchange() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->worker.joinable()) impl_->worker.join();
}

std::string Exchange::subject() const { return "swarm." + config_.swarm_name + ".groups." + config_.node_id; }
std::string Exchange::stream_name() const { return "SWARM_" + config_.swarm_name; }

std::string Exchange::message_id(const SapoGroup& group) const {
  SapoGroup identity;
  identity.node_id = group.node_id;
  identity.run = run_id_;
  identity.policy_step = group.policy_step;
  identity.task_id = group.task_id;
  return sapo_message_id(identity);
}

void Exchange::publish(const SapoGroup& group) {
  if (!config_.publish) return;
  if (sapo_zero_advantage(group)) {  // every receiver would drop it
    std::lock_guard lk(impl_->mu);
    ++impl_->st.publish_skipped_zero_advantage;
    return;
  }
  SapoGroup stamped = group;
  stamped.run = run_id_;
  Impl::Outgoing out{sapo_message_id(stamped), encode_sapo_group(stamped)};
  std::lock_guard lk(impl_->mu);
  if (static_cast<int64_t>(out.payload.size()) > config_.max_message_bytes) {
    ++impl_->st.publish_too_large;
    spdlog::warn(
        "exchange: group of task '{}' is {} bytes, over exchange_max_message_bytes ({}): not published",
        group.task_id, out.payload.size(), config_.max_message_bytes);
    return;
  }
  impl_->outbox.push_back(std::move(out));
  while (static_cast<int64_t>(impl_->outbox.size()) > config_.outbox_groups) {
    impl_->outbox.pop_front();
    ++impl_->st.outbox_dropped;
  }
  impl_->cv.notify_all();
}

void Exchange::receive(const std::string& subject, std::string_view payload, const std::string& msg_id) {
  const std::string prefix = "swarm." + config_.swarm_name + ".groups.";
  const std::string node = subject.rfind(prefix, 0) == 0 ? subject.substr(prefix.size()) : std::string();
  std::lock_guard lk(impl_->mu);
  ExchangeStatus& st = impl_->st;
  ++st.received;
  if (node == config_.node_id) return impl_->drop_locked(SapoDrop::OWN, nullptr);
  ExchangePeer* peer = valid_swarm_token(node) ? &impl_->peer_locked(node) : &impl_->peer_locked(kOtherPeers);
  ++peer->received;
  peer->last_seen = impl_->now();
  if (!config_.trusted_nodes.empty() && std::find(config_.trusted_nodes.begin(), config_.trusted_nodes.end(),
                                                  node) == config_.trusted_nodes.end())
    return impl_->drop_locked(SapoDrop::UNTRUSTED, peer);
  SapoLimits limits;
  limits.max_bytes = config_.max_message_bytes;
  limits.now = impl_->now();  // `created` too far ahead is refused: it would dodge `stale`
  SapoParse parsed = parse_sapo_group(payload, limits);
  if (!parsed.group) {
    spdlog::debug("exchange: dropped a message from '{}': {} ({})", node, sapo_drop_name(parsed.drop),
                  parsed.reason);
    return impl_->drop_locked(parsed.drop, peer);
  }
  SapoGroup& g = *parsed.group;
  if (g.node_id != node) return impl_->drop_locked(SapoDrop::SPOOFED, peer);
  peer->model = g.model.substr(0, 128);
  peer->last_policy_step = g.policy_step;
  // The group's identity (node, run, step, task) is what is de-duplicated, so a copy republished
  // under another id (or none) is still a duplicate; a new group must come under its own id.
  std::string id = sapo_message_id(g);
  if (impl_->recent_set.count(id) > 0) return impl_->drop_locked(SapoDrop::DUPLICATE, peer);
  if (msg_id.empty()) return impl_->drop_locked(SapoDrop::NO_ID, peer);
  if (msg_id != id) {
    spdlog::debug("exchange: dropped a message from '{}': its Nats-Msg-Id '{}' is not '{}'", node,
                  msg_id.substr(0, 256), id);
    return impl_->drop_locked(SapoDrop::ID_MISMATCH, peer);
  }
  if (impl_->now() - g.created > config_.max_age_seconds) return impl_->drop_locked(SapoDrop::STALE, peer);
  if (sapo_zero_advantage(g)) return impl_->drop_locked(SapoDrop::ZERO_ADVANTAGE, peer);
  impl_->recent_set.insert(id);
  impl_->recent_ids.push_back(std::move(id));
  const size_t keep = static_cast<size_t>(std::max<int64_t>(1024, 4 * config_.buffer_groups));
  while (impl_->recent_ids.size() > keep) {
    impl_->recent_set.erase(impl_->recent_ids.front());
    impl_->recent_ids.pop_front();
  }
  ++peer->accepted;
  ++st.accepted;
  impl_->buffer.push_back({std::move(g)});
  if (static_cast<int64_t>(impl_->buffer.size()) > config_.buffer_groups) {
    // Full: the oldest group of the peer holding the most goes, so a flooding peer pushes out
    // its own groups, not the others'.
    std::map<std::string, int64_t> held;
    for (const auto& b : impl_->buffer) ++held[b.group.node_id];
    const auto most = std::max_element(held.begin(), held.end(),
                                       [](const auto& x, const auto& y) { return x.second < y.second; });
    const std::string from = most->first;
    const auto victim = std::find_if(impl_->buffer.begin(), impl_->buffer.end(),
                                     [&](const Impl::Buffered& b) { return b.group.node_id == from; });
    impl_->drop_locked(SapoDrop::EVICTED, &impl_->peer_locked(from));
    impl_->buffer.erase(victim);
  }
  st.buffered = static_cast<int64_t>(impl_->buffer.size());
  impl_->cv.notify_all();
}

std::vector<SapoGroup> Exchange::draw(size_t count, std::mt19937_64& rng) {
  std::vector<SapoGroup> out;
  std::lock_guard lk(impl_->mu);
  auto& buffer = impl_->buffer;
  const double now = impl_->now();
  for (auto it = buffer.begin(); it != buffer.end();) {
    if (now - it->group.created > config_.max_age_seconds) {
      impl_->drop_locked(SapoDrop::STALE, &impl_->peer_locked(it->group.node_id));
      it = buffer.erase(it);
    } else {
      ++it;
    }
  }
  while (out.size() < count && !buffer.empty()) {
    std::uniform_int_distribution<size_t> pick(0, buffer.size() - 1);
    const size_t i = pick(rng);
    out.push_back(std::move(buffer[i].group));
    buffer.erase(buffer.begin() + static_cast<std::ptrdiff_t>(i));
    ++impl_->peer_locked(out.back().node_id).used;
    ++impl_->st.used;
  }
  impl_->st.buffered = static_cast<int64_t>(buffer.size());
  return out;
}

void Exchange::note_unusable(const SapoGroup& group, SapoDrop reason) {
  std::lock_guard lk(impl_->mu);
  ExchangePeer& peer = impl_->peer_locked(group.node_id);
  if (peer.used > 0) --peer.used;
  if (impl_->st.used > 0) --impl_->st.used;
  impl_->drop_locked(reason, &peer);
}

ExchangeStatus Exchange::status() const {
  std::lock_guard lk(impl_->mu);
  ExchangeStatus s = impl_->st;
  s.outbox = static_cast<int64_t>(impl_->outbox.size());
  s.buffered = static_cast<int64_t>(impl_->buffer.size());
  return s;
}

bool Exchange::wait_buffered(size_t n, double timeout_seconds) const {
  std::unique_lock lk(impl_->mu);
  return impl_->cv.wait_for(lk, std::chrono::duration<double>(timeout_seconds),
                            [&] { return impl_->buffer.size() >= n; });
}

}  // namespace swarm
