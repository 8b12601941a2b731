#include "overwatch/render.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace swarm::overwatch {
namespace {

// SGR parameters.
constexpr const char* kBold = "1";
constexpr const char* kDim = "2";
constexpr const char* kRed = "31";
constexpr const char* kGreen = "32";
constexpr const char* kYellow = "33";
constexpr const char* kBlue = "34";
constexpr const char* kMagenta = "35";
constexpr const char* kCyan = "36";
constexpr const char* kBoldRed = "1;31";

constexpr size_t kLabelWidth = 11;  // "  episodes " style row labels, after the 2-column margin

struct Style {
  bool color = true;
  std::string paint(std::string_view text, const char* sgr) const {
    if (!color || text.empty()) return std::string(text);
    return fmt::format("\x1b[{}m{}\x1b[0m", sgr, text);
  }
};

// Decodes one UTF-8 code point at s[i]; advances i. Returns -1 for an invalid sequence
// (i then moves past one byte).
int32_t decode_utf8(std::string_view s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  size_t len = 0;
  int32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    ++i;
    return -1;
  }
  if (i + len > s.size()) {
    ++i;
    return -1;
  }
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      ++i;
      return -1;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are invalid.
  static constexpr int32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return -1;
  }
  i += len;
  return cp;
}

// Columns of one code point: 2 for the common East Asian wide / emoji ranges, else 1.
size_t columns_of(int32_t cp) {
  const bool wide = (cp >= 0x1100 && cp <= 0x115F) || (cp >= 0x2E80 && cp <= 0xA4CF && cp != 0x303F) ||
                    (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xF900 && cp <= 0xFAFF) ||
                    (cp >= 0xFE30 && cp <= 0xFE4F) || (cp >= 0xFF00 && cp <= 0xFF60) ||
                    (cp >= 0xFFE0 && cp <= 0xFFE6) || (cp >= 0x1F300 && cp <= 0x1F64F) ||
                    (cp >= 0x1F900 && cp <= 0x1F9FF) || (cp >= 0x20000 && cp <= 0x3FFFD);
  return wide ? 2 : 1;
}

// Length of the escape sequence starting at s[i] (s[i] == ESC).
size_t escape_length(std::string_view s, size_t i) {
  size_t j = i + 1;
  if (j >= s.size()) return 1;
  if (s[j] == '[') {
    ++j;
    while (j < s.size() && !(s[j] >= 0x40 && s[j] <= 0x7E)) ++j;
    return std::min(s.size(), j + 1) - i;
  }
  return 2;
}

std::string repeat(std::string_view s, size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (size_t k = 0; k < n; ++k) out += s;
  return out;
}

// `s` padded with spaces (or cut) to exactly `width` columns.
std::string pad(std::string_view s, size_t width) {
  std::string out = fit_line(s, width);
  const size_t w = display_width(out);
  if (w < width) out.append(width - w, ' ');
  return out;
}

std::string format_reward(double v) {
  if (!std::isfinite(v)) return "–";
  return fmt::format("{:.3f}", v);
}

std::string short_id(const std::string& id) { return sanitize(id.size() > 8 ? id.substr(0, 8) : id); }

const char* state_color(const std::string& state) {
  if (state == "ENGINE.ROLLING") return kGreen;
  if (state == "ENGINE.ROLLING_POST") return kYellow;
  if (state == "ENGINE.WEIGHT_SYNCING") return kMagenta;
  if (state == "ENGINE.BOOTING") return kBlue;
  if (state == "ENGINE.OFFLINE") return kRed;
  return kCyan;
}

// A section rule: "── Title ─────────" across the width.
std::string section(const Style& st, std::string_view title, size_t width) {
  std::string head = fmt::format("── {} ", title);
  const size_t w = display_width(head);
  if (w < width) head += repeat("─", width - w);
  return st.paint(head, kDim);
}

// Items joined by " · ", wrapped onto as many lines as the width needs.
std::vector<std::string> pack(const std::vector<std::string>& items, size_t width, const Style& st) {
  std::vector<std::string> lines;
  const std::string sep = st.paint(" · ", kDim);
  std::string line = "  ";
  size_t used = 2;
  bool empty = true;
  for (const auto& item : items) {
    const size_t w = display_width(item);
    if (!empty && used + 3 + w > width) {
      lines.push_back(line);
      line = "  ";
      used = 2;
      empty = true;
    }
    if (!empty) {
      line += sep;
      used += 3;
    }
    line += item;
    used += w;
    empty = false;
  }
  if (!empty) lines.push_back(line);
  return lines;
}

// Which target the active collection method stops at: 0 episodes, 1 tasks, 2 non-dummy tasks.
int active_target(const std::string& method) {
  if (method == "rollout_until_finish_enough_episodes") return 0;
  if (method == "rollout_until_finish_enough_tasks") return 1;
  if (method == "rollout_until_finish_enough_non_dummy_tasks") return 2;
  return -1;
}

// A list that may have to give up rows to fit the screen.
struct List {
  std::vector<std::string> head;  // section rule (+ column header)
  std::vector<std::string> rows;
};

void emit_list(const List& list, size_t limit, const Style& st, std::vector<std::string>& out) {
  out.insert(out.end(), list.head.begin(), list.head.end());
  if (list.rows.size() <= limit) {
    out.insert(out.end(), list.rows.begin(), list.rows.end());
    return;
  }
  if (limit == 0) return;
  out.insert(out.end(), list.rows.begin(), list.rows.begin() + static_cast<std::ptrdiff_t>(limit - 1));
  out.push_back(st.paint(fmt::format("  … {} more", list.rows.size() - (limit - 1)), kDim));
}

std::string title_line(const FrameInput& in, const Snapshot* snap, const Style& st, size_t width) {
  std::string left = st.paint("swarm-overwatch", kBold) + "  " + sanitize(in.url);
  std::vector<std::string> right_parts;
  if (snap && snap->engine) {
    if (!snap->engine->engine.empty()) right_parts.push_back(sanitize(snap->engine->engine));
    if (!snap->engine->model.empty()) right_parts.push_back(sanitize(snap->engine->model));
  }
  if (!in.clock.empty()) right_parts.push_back(sanitize(in.clock));
  std::string right;
  for (const auto& p : right_parts) right += (right.empty() ? "" : " · ") + p;
  const size_t lw = display_width(left), rw = display_width(right);
  if (right.empty() || lw + 2 + rw > width) return left;
  return left + std::string(width - lw - rw, ' ') + st.paint(right, kDim);
}

std::vector<std::string> render_unreachable(const FrameInput& in, const RenderOptions& opt, const Style& st) {
  const size_t width = static_cast<size_t>(std::max(opt.width, 1));
  const ConnectionState& c = in.connection;
  std::vector<std::string> out;
  out.push_back(title_line(in, nullptr, st, width));
  out.emplace_back();
  out.push_back("  " + st.paint("✖ SERVER UNREACHABLE", kBoldRed));
  out.emplace_back();
  for (auto& l : pack({"down for " + st.paint(format_duration(c.down_seconds), kBold),
                       fmt::format("{} failed poll{}", c.failed_polls, c.failed_polls == 1 ? "" : "s"),
                       "retrying every " + format_duration(in.interval_seconds)},
                      width, Style{false}))
    out.push_back(std::move(l));
  const std::string error = sanitize(c.last_error.empty() ? "(none)" : c.last_error);
  const size_t indent = 2 + display_width("last error: ");
  const auto wrapped = wrap_text(error, width > indent + 10 ? width - indent : 10);
  for (size_t k = 0; k < wrapped.size() && k < 4; ++k)
    out.push_back((k == 0 ? "  last error: " : std::string(indent, ' ')) + st.paint(wrapped[k], kRed));
  if (c.ever_reached && in.snapshot) {
    const PoolInfo& p = in.snapshot->pool;
    for (auto& l : pack({fmt::format("last seen {} ago: {}", format_duration(c.seconds_since_last_ok),
                                     sanitize(p.engine_status.empty() ? "?" : p.engine_status)),
                         fmt::format("step {}", p.global_step), fmt::format("policy v{}", p.policy_version)},
                        width, Style{false}))
      out.push_back(std::move(l));
  } else {
    for (auto& l : wrap_text("never reached since swarm-overwatch started", width > 4 ? width - 2 : 2))
      out.push_back("  " + l);
  }
  if (opt.interactive) {
    out.emplace_back();
    out.push_back(st.paint("  q quit · the monitor keeps retrying", kDim));
  }
  return out;
}

std::vector<std::string> state_lines(const PoolInfo& p, const Style& st, size_t width) {
  std::vector<std::string> out;
  const std::string state = p.engine_status.empty() ? "ENGINE.?" : sanitize(p.engine_status);
  std::string line = "  " + st.paint("● " + state, fmt::format("1;{}", state_color(p.engine_status)).c_str());
  line += fmt::format("  for {}", format_duration(p.seconds_in_state));
  line += st.paint("   step ", kDim) + st.paint(std::to_string(p.global_step), kBold);
  line += st.paint(" · policy v", kDim) + std::to_string(p.policy_version);
  line += st.paint(" · claims ", kDim) +
          (p.accepting_claims ? st.paint("open", kGreen) : st.paint("closed", kYellow));
  out.push_back(line);
  if (p.has_training) {
    // The mode, the trainer beside the collection, and how stale the last step's tokens were.
    std::string t = st.paint("  training ", kDim) +
                    (p.max_staleness > 0 ? fmt::format("async (max_staleness {})", p.max_staleness)
                                         : std::string("synchronous"));
    t += st.paint(" · trainer ", kDim) + (p.trainer_step > 0
                                              ? st.paint(fmt::format("on step {}", p.trainer_step), kBold)
                                              : std::string("idle"));
    if (!p.step_history.empty()) {
      const StepPoint& last = p.step_history.back();
      t += st.paint(" · staleness ", kDim) +
           fmt::format("mean {:.2f} max {:.0f}", last.staleness_mean, last.staleness_max);
      if (last.stale_dropped > 0)
        t += st.paint(fmt::format(" · {} stale dropped", last.stale_dropped), kYellow);
    }
    out.push_back(t);
  }
  if (p.exchange.present) {
    // Swarm experience sharing: the broker, what went out and came in, and each peer.
    const ExchangeInfo& x = p.exchange;
    std::string l = st.paint("  swarm ", kDim) + sanitize(x.swarm_name) + st.paint(" as ", kDim) +
                    sanitize(x.node_id) + " " +
                    (x.ready ? st.paint("● connected", kGreen)
                             : st.paint(x.connected ? "● connecting" : "● broker unreachable", kYellow));
    l += st.paint(" · published ", kDim) + std::to_string(x.published);
    if (x.outbox > 0) l += st.paint(fmt::format(" ({} waiting)", x.outbox), kYellow);
    l += st.paint(" · accepted ", kDim) + fmt::format("{}/{}", x.accepted, x.received);
    l += st.paint(" · buffered ", kDim) + std::to_string(x.buffered);
    l += st.paint(" · used ", kDim) + std::to_string(x.used);
    if (x.dropped > 0) l += st.paint(fmt::format(" · {} dropped", x.dropped), kYellow);
    out.push_back(l);
    constexpr size_t kMaxPeers = 4;
    for (size_t k = 0; k < x.peers.size() && k < kMaxPeers; ++k) {
      const ExchangePeerInfo& q = x.peers[k];
      std::string pl = st.paint("    peer ", kDim) + sanitize(q.node_id);
      if (!q.model.empty()) pl += st.paint(" (", kDim) + sanitize(q.model) + st.paint(")", kDim);
      pl += st.paint(" · accepted ", kDim) + std::to_string(q.accepted) + st.paint(" · used ", kDim) +
            std::to_string(q.used);
      if (q.dropped > 0) pl += st.paint(fmt::format(" · {} dropped", q.dropped), kYellow);
      if (q.last_policy_step >= 0) pl += st.paint(" · step ", kDim) + std::to_string(q.last_policy_step);
      if (q.seconds_since_seen >= 0)
        pl += st.paint(" · seen ", kDim) + format_duration(q.seconds_since_seen) + " ago";
      out.push_back(pl);
    }
    if (x.peers.size() > kMaxPeers)
      out.push_back(st.paint(fmt::format("    … {} more peers", x.peers.size() - kMaxPeers), kDim));
  }
  if (!p.engine_status_detail.empty()) {
    const auto wrapped = wrap_text(sanitize(p.engine_status_detail), width > 12 ? width - 10 : 2);
    for (size_t k = 0; k < wrapped.size() && k < 2; ++k)
      out.push_back((k == 0 ? "  detail: " : "          ") + wrapped[k]);
  }
  return out;
}

std::vector<std::string> batch_lines(const PoolInfo& p, const Style& st, size_t width, bool compact) {
  std::vector<std::string> out;
  out.push_back(section(st, "Batch", width));
  if (p.target_episodes <= 0 && p.target_tasks <= 0) {
    out.push_back(st.paint(p.engine_status == "ENGINE.OFFLINE"
                               ? "  no batch: the engine is offline (sync_train_config, then start_engine)"
                               : "  no batch targets yet",
                           kDim));
    return out;
  }
  const int active = active_target(p.sample_collection_method);
  out.push_back(fmt::format("  {}{}", pad("method", kLabelWidth),
                            sanitize(p.sample_collection_method.empty() ? "?" : p.sample_collection_method)) +
                st.paint(fmt::format(" · batch {} tasks × {} repeats", p.batch_size, p.num_repeat), kDim));
  struct Row {
    const char* label;
    int64_t done, target;
  };
  const Row rows[3] = {{"episodes", p.finished_episodes, p.target_episodes},
                       {"tasks", p.complete_tasks, p.target_tasks},
                       {"non-dummy", p.complete_non_dummy_tasks, p.target_non_dummy_tasks}};
  int64_t widest = 1;
  for (const auto& r : rows) widest = std::max({widest, r.done, r.target});
  const size_t digits = std::to_string(widest).size();
  // "  label      [bar] done/target  pct%"
  const size_t numbers = 2 * digits + 1 + 6;
  const size_t fixed = 2 + kLabelWidth + 2 + 1 + numbers + (active >= 0 ? 10 : 0);  // + "  ← target"
  const size_t bar_width = width > fixed + 5 ? std::min<size_t>(width - fixed, 50) : 5;
  // The active target first: it is the one that ends the batch.
  int order[3] = {0, 1, 2};
  if (active > 0) std::rotate(order, order + active, order + active + 1);
  for (int k : order) {
    const Row& r = rows[k];
    const bool is_active = k == active;
    if (compact && active >= 0 && !is_active) continue;
    const double pct = r.target > 0 ? 100.0 * std::min<double>(r.done, r.target) / r.target : 0.0;
    const bool full = r.target > 0 && r.done >= r.target;
    const std::string bar =
        st.paint(progress_bar(static_cast<double>(r.done), static_cast<double>(r.target), bar_width),
                 is_active ? (full ? kGreen : kCyan) : kDim);
    const std::string label = pad(r.label, kLabelWidth);
    std::string line = is_active ? st.paint("▶ ", kCyan) + st.paint(label, kBold) : "  " + label;
    line += "[" + bar + "] ";
    line += fmt::format("{:>{}}/{:<{}} {:>3.0f}%", r.done, digits, r.target, digits, pct);
    if (is_active) line += st.paint("  ← target", kDim);
    out.push_back(line);
  }
  out.push_back(
      "  " + pad("slots", kLabelWidth) +
      fmt::format("running {} · unclaimed {} · max {}", p.running, p.unclaimed, p.max_parallel_episodes));
  return out;
}

List running_list(const PoolInfo& p, const Style& st, size_t width) {
  List list;
  list.head.push_back(section(st, fmt::format("Running episodes ({})", p.running_episodes.size()), width));
  if (p.running_episodes.empty()) {
    list.rows.push_back(st.paint("  none", kDim));
    return list;
  }
  // "  EPISODE   CLIENT    TYPE   CALLS   AGE      IDLE / TIMEOUT"
  list.head.push_back(st.paint("  EPISODE   CLIENT    TYPE   CALLS   AGE     IDLE / TIMEOUT", kDim));
  // Closest to its timeout first: those are the ones about to be reclaimed.
  std::vector<const RunningEpisode*> eps;
  for (const auto& e : p.running_episodes) eps.push_back(&e);
  auto ratio = [](const RunningEpisode* e) {
    return e->discard_episode_timeout > 0 ? e->seconds_idle / e->discard_episode_timeout : 0.0;
  };
  std::stable_sort(eps.begin(), eps.end(), [&](auto* a, auto* b) { return ratio(a) > ratio(b); });
  for (const RunningEpisode* e : eps) {
    std::string calls = std::to_string(e->llm_calls);
    if (e->in_flight_calls > 0) calls += fmt::format(" +{}", e->in_flight_calls);
    std::string line = "  " + pad(short_id(e->episode_uuid), 10) + pad(short_id(e->client_uuid), 10) +
                       pad(sanitize(e->episode_type), 7) + pad(calls, 8) +
                       pad(format_duration(e->seconds_since_claim), 8);
    const std::string idle =
        format_duration(e->seconds_idle) + " / " + format_duration(e->discard_episode_timeout);
    const double r = ratio(e);
    const char* color = r >= 0.8 ? kRed : r >= 0.5 ? kYellow : kGreen;
    line += st.paint(pad(idle, 16), e->in_flight_calls > 0 ? kCyan : color);
    const size_t used = display_width(line);
    if (width > used + 6 && e->discard_episode_timeout > 0) {
      const size_t bw = std::min<size_t>(width - used - 3, 20);
      line += " [" + st.paint(progress_bar(e->seconds_idle, e->discard_episode_timeout, bw), color) + "]";
    }
    list.rows.push_back(line);
  }
  return list;
}

List task_list(const PoolInfo& p, const Style& st, size_t width) {
  List list;
  int64_t complete = 0;
  for (const auto& t : p.tasks) complete += t.complete ? 1 : 0;
  list.head.push_back(
      section(st, fmt::format("Tasks in the batch ({}, {} complete)", p.tasks.size(), complete), width));
  if (p.tasks.empty()) {
    list.rows.push_back(st.paint("  none yet", kDim));
    return list;
  }
  size_t id_width = 4;
  for (const auto& t : p.tasks) id_width = std::max(id_width, display_width(sanitize(t.task_id)));
  id_width = std::min(id_width + 2, std::max<size_t>(12, width / 3));
  const std::string header = "  " + pad("TASK", id_width) + pad("EPISODES", 14) + "REWARD mean ± std";
  list.head.push_back(st.paint(header, kDim));
  for (const auto& t : p.tasks) {
    std::string eps =
        p.num_repeat > 0 ? fmt::format("{}/{}", t.episodes, p.num_repeat) : std::to_string(t.episodes);
    std::string mark;
    if (t.complete) mark = t.dummy ? st.paint(" ✓ dummy", kYellow) : st.paint(" ✓", kGreen);
    std::string line = "  " + pad(sanitize(t.task_id), id_width) + pad(eps + mark, 14);
    line += format_reward(t.reward_mean);
    line += st.paint(" ± ", kDim) + format_reward(t.reward_std);
    list.rows.push_back(line);
  }
  return list;
}

std::vector<std::string> reward_lines(const FrameInput& in, const PoolInfo& p, const Style& st,
                                      size_t width) {
  std::vector<std::string> out;
  out.push_back(section(st, "Reward", width));
  const size_t label = 2 + kLabelWidth;
  auto spark_line = [&](const char* name, const std::vector<double>& values, const std::string& stats) {
    const size_t sw = display_width(stats);
    const std::string lead = "  " + pad(name, kLabelWidth);
    if (width >= label + 10 + 2 + sw) {
      const size_t room = std::min<size_t>(width - label - 2 - sw, 64);
      const std::string spark = sparkline(values, room);
      out.push_back(lead + st.paint(spark, kCyan) + "  " + stats);
    } else {  // narrow: the sparkline on its own line, the figures below
      out.push_back(lead + st.paint(sparkline(values, width > label ? width - label : 1), kCyan));
      out.push_back(std::string(label, ' ') + stats);
    }
  };
  if (in.step_history.empty()) {
    out.push_back("  " + pad("per step", kLabelWidth) + st.paint("no finished step yet", kDim));
  } else {
    std::vector<double> means;
    double lo = INFINITY, hi = -INFINITY;
    for (const auto& s : in.step_history) {
      means.push_back(s.reward_mean);
      if (std::isfinite(s.reward_mean)) lo = std::min(lo, s.reward_mean), hi = std::max(hi, s.reward_mean);
    }
    const StepPoint& last = in.step_history.back();
    std::string stats = fmt::format("step {}: {} ± {}", last.global_step, format_reward(last.reward_mean),
                                    format_reward(last.reward_std));
    // A swarm node trains on external groups too: its step reward is theirs and its own.
    if (p.exchange.present) {
      stats += st.paint(" with external groups", kDim);
      if (std::isfinite(last.local_reward_mean))
        stats += st.paint(" · local ", kDim) + format_reward(last.local_reward_mean);
    }
    if (std::isfinite(lo))
      stats += st.paint(fmt::format(" · range {}..{}", format_reward(lo), format_reward(hi)), kDim);
    stats += st.paint(
        fmt::format(" · {} step{}", in.step_history.size(), in.step_history.size() == 1 ? "" : "s"), kDim);
    const auto idle = std::count_if(in.step_history.begin(), in.step_history.end(),
                                    [](const StepPoint& s) { return s.trained_nothing; });
    if (last.trained_nothing)
      stats += st.paint(" · this step trained nothing (the server log says why)", kYellow);
    else if (idle > 0)
      stats += st.paint(fmt::format(" · {} trained nothing", idle), kYellow);
    spark_line("per step", means, stats);
  }
  if (p.recent_rewards.empty()) {
    out.push_back("  " + pad("episodes", kLabelWidth) + st.paint("no finished episode yet", kDim));
  } else {
    double sum = 0;
    size_t n = 0;
    for (double r : p.recent_rewards)
      if (std::isfinite(r)) sum += r, ++n;
    spark_line("episodes", p.recent_rewards,
               fmt::format("mean {}", n ? format_reward(sum / static_cast<double>(n)) : "–") +
                   st.paint(fmt::format(" · last {}", p.recent_rewards.size()), kDim));
  }
  // The server always reports eval/episodes; the line only shows once there is an eval figure.
  const bool any_eval = std::any_of(p.eval_metrics.begin(), p.eval_metrics.end(),
                                    [](const auto& kv) { return kv.second != 0.0; });
  if (any_eval) {
    std::vector<std::string> items;
    for (const auto& [k, v] : p.eval_metrics) items.push_back(fmt::format("{} {:.4g}", sanitize(k), v));
    auto lines = pack(items, width > label ? width - label + 2 : 10, st);
    for (size_t k = 0; k < lines.size(); ++k)
      out.push_back((k == 0 ? "  " + pad("eval", kLabelWidth) : std::string(label, ' ')) +
                    lines[k].substr(2));
  }
  return out;
}

std::vector<std::string> traffic_lines(const FrameInput& in, const PoolInfo& p, const Style& st, size_t width,
                                       bool compact) {
  std::vector<std::string> out;
  out.push_back(section(st, "Traffic", width));
  std::vector<std::string> items;
  const auto& r = in.snapshot->requests;
  if (r) {
    std::string req = "requests " + format_count(r->total);
    if (in.requests_per_second) req += fmt::format(" ({:.1f}/s)", *in.requests_per_second);
    items.push_back(req);
    items.push_back("openai " + format_count(r->openai));
    const int64_t errors = r->client_errors + r->server_errors;
    std::string err = fmt::format("errors {} (4xx {}, 5xx {})", format_count(errors),
                                  format_count(r->client_errors), format_count(r->server_errors));
    items.push_back(r->server_errors > 0 ? st.paint(err, kRed) : errors > 0 ? st.paint(err, kYellow) : err);
    items.push_back(fmt::format("tokens {} in / {} out", format_count(r->prompt_tokens),
                                format_count(r->completion_tokens)));
  } else {
    items.push_back(st.paint("requests n/a (/metrics unavailable)", kDim));
  }
  for (auto& l : pack(items, width, st)) out.push_back(std::move(l));
  if (compact) return out;
  // The inference engine's prefix cache and KV blocks (a line of their own, dropped first).
  std::vector<std::string> cache;
  if (r && r->prefix_queries_tokens > 0 && r->prefix_hit_tokens >= 0)
    cache.push_back(fmt::format(
        "prefix cache {:.1f}% of {} prompt tokens",
        100.0 * static_cast<double>(r->prefix_hit_tokens) / static_cast<double>(r->prefix_queries_tokens),
        format_count(r->prefix_queries_tokens)));
  if (r && r->kv_blocks_free >= 0) cache.push_back("kv blocks free " + format_count(r->kv_blocks_free));
  for (auto& l : pack(cache, width, st)) out.push_back(std::move(l));
  // Every rank of a multi-rank job serves: a line each (rank 0 routes the requests).
  if (p.serving.size() > 1) {
    for (const RankServingInfo& r : p.serving) {
      std::string line =
          fmt::format("  rank {:<3} requests {:>7}  tokens {:>7}  in flight {}", r.rank,
                      format_count(r.requests), format_count(r.generated_tokens), format_count(r.in_flight));
      if (!r.up) line += "  " + st.paint("down", kRed);
      out.push_back(fit_line(line, width));
    }
  }

  std::vector<std::string> events;
  auto add = [&](const char* label, const char* key, const char* warn_color) {
    const int64_t v = p.counter(key);
    const std::string item = fmt::format("{} {}", label, format_count(v));
    events.push_back(v > 0 && warn_color ? st.paint(item, warn_color) : item);
  };
  add("claimed", "claimed", nullptr);
  add("ended", "ended", nullptr);
  add("eval", "ended_eval", nullptr);
  add("no reward", "ended_without_reward", kYellow);
  add("aborted", "aborted", kYellow);
  add("timed out", "timed_out", kYellow);
  add("cancelled", "cancelled", kYellow);
  add("llm calls", "llm_calls", nullptr);
  add("late calls", "late_calls_dropped", kYellow);
  add("valve drops", "valve_dropped_episodes", kYellow);
  add("batches", "batches_taken", nullptr);
  if (p.max_staleness > 0) {  // asynchronous training's bound at work
    add("stale drops", "stale_dropped_episodes", kYellow);
    add("claims held", "claims_held_by_staleness", nullptr);
  }
  for (auto& l : pack(events, width, st)) out.push_back(std::move(l));
  return out;
}

std::vector<std::string> render_dashboard(const FrameInput& in, const RenderOptions& opt, const Style& st) {
  const size_t width = static_cast<size_t>(std::max(opt.width, 1));
  const size_t height = opt.height > 0 ? static_cast<size_t>(opt.height) : 0;
  const Snapshot& snap = *in.snapshot;
  const PoolInfo& p = snap.pool;
  const List running = running_list(p, st, width);
  const List tasks = task_list(p, st, width);
  const std::string footer =
      opt.interactive
          ? st.paint(fmt::format("  q quit · refresh every {}", format_duration(in.interval_seconds)), kDim)
          : std::string();

  // Everything but the two lists. On a short screen, secondary lines go first to leave
  // rows for the lists: compact 1 drops the targets the method does not stop at, 2 also
  // the episode counters.
  std::vector<std::string> top, bottom;
  auto build = [&](int compact) {
    top.clear();
    bottom.clear();
    top.push_back(title_line(in, &snap, st, width));
    for (auto& l : state_lines(p, st, width)) top.push_back(std::move(l));
    for (auto& l : batch_lines(p, st, width, compact >= 1)) top.push_back(std::move(l));
    bottom = reward_lines(in, p, st, width);
    for (auto& l : traffic_lines(in, p, st, width, compact >= 2)) bottom.push_back(std::move(l));
  };
  auto fixed = [&] {
    return top.size() + bottom.size() + running.head.size() + tasks.head.size() + (footer.empty() ? 0 : 1);
  };
  const size_t wanted_rows =
      std::min<size_t>(running.rows.size(), 3) + std::min<size_t>(tasks.rows.size(), 3);
  build(0);
  for (int compact = 1; compact <= 2 && height > 0 && fixed() + wanted_rows > height; ++compact)
    build(compact);

  size_t limit_running = static_cast<size_t>(std::max(opt.max_list_rows, 1));
  size_t limit_tasks = limit_running;
  if (height > 0) {
    const size_t avail = height > fixed() ? height - fixed() : 0;
    // Half each; what one list does not need goes to the other.
    limit_running = std::min(running.rows.size(), avail / 2);
    limit_tasks = std::min(tasks.rows.size(), avail - limit_running);
    limit_running = std::min(running.rows.size(), avail - limit_tasks);
  }
  std::vector<std::string> out = std::move(top);
  emit_list(running, limit_running, st, out);
  emit_list(tasks, limit_tasks, st, out);
  out.insert(out.end(), bottom.begin(), bottom.end());
  // On a screen too short even for that, the footer (how to quit) still shows.
  if (height > 0 && out.size() + (footer.empty() ? 0 : 1) > height)
    out.resize(footer.empty() ? height : height - 1);
  if (!footer.empty()) out.push_back(footer);
  return out;
}

}  // namespace

std::vector<std::string> render_frame(const FrameInput& in, const RenderOptions& options) {
  const Style st{options.color};
  std::vector<std::string> lines = in.connection.reachable && in.snapshot
                                       ? render_dashboard(in, options, st)
                                       : render_unreachable(in, options, st);
  if (options.height > 0 && lines.size() > static_cast<size_t>(options.height))
    lines.resize(static_cast<size_t>(options.height));
  const size_t width = static_cast<size_t>(std::max(options.width, 1));
  for (auto& l : lines) l = fit_line(l, width);
  return lines;
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "-";
  if (s < 9.95) return fmt::format("{:.1f}s", s);
  const auto t = static_cast<int64_t>(s);
  if (t < 60) return fmt::format("{}s", t);
  if (t < 3600) return fmt::format("{}m{:02}s", t / 60, t % 60);
  if (t < 86400) return fmt::format("{}h{:02}m", t / 3600, (t % 3600) / 60);
  return fmt::format("{}d{:02}h", t / 86400, (t % 86400) / 3600);
}

std::string format_count(int64_t n) {
  const int64_t a = n < 0 ? -n : n;
  if (a < 10000) return std::to_string(n);
  if (a < 1000000) return fmt::format("{:.1f}k", static_cast<double>(n) / 1e3);
  if (a < 1000000000) return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6);
  return fmt::format("{:.2f}G", static_cast<double>(n) / 1e9);
}

std::string sparkline(const std::vector<double>& values, size_t width) {
  static constexpr const char* kLevels[8] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  if (width == 0 || values.empty()) return "";
  const size_t first = values.size() > width ? values.size() - width : 0;
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = first; i < values.size(); ++i)
    if (std::isfinite(values[i])) lo = std::min(lo, values[i]), hi = std::max(hi, values[i]);
  std::string out;
  for (size_t i = first; i < values.size(); ++i) {
    const double v = values[i];
    if (!std::isfinite(v)) {
      out += ' ';
    } else if (hi - lo < 1e-12) {
      out += kLevels[3];
    } else {
      const auto level = static_cast<int>(std::lround((v - lo) / (hi - lo) * 7.0));
      out += kLevels[std::clamp(level, 0, 7)];
    }
  }
  return out;
}

std::string progress_bar(double done, double target, size_t width) {
  static constexpr const char* kPartial[8] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  if (width == 0) return "";
  const double frac = target > 0 && std::isfinite(done) ? std::clamp(done / target, 0.0, 1.0) : 0.0;
  const auto cells8 = static_cast<int64_t>(width) * 8;
  auto eighths = static_cast<int64_t>(std::llround(frac * static_cast<double>(cells8)));
  // Some progress always shows, and an unfinished bar never looks finished.
  if (frac > 0 && eighths == 0) eighths = 1;
  if (frac < 1.0 && eighths == cells8) eighths = cells8 - 1;
  const auto full = static_cast<size_t>(eighths / 8);
  const auto rem = static_cast<size_t>(eighths % 8);
  std::string out = repeat("█", full);
  size_t cells = full;
  if (rem > 0) {
    out += kPartial[rem];
    ++cells;
  }
  out += repeat("░", width - cells);
  return out;
}

size_t display_width(std::string_view s) {
  size_t cols = 0;
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '\x1b') {
      i += escape_length(s, i);
      continue;
    }
    const int32_t cp = decode_utf8(s, i);
    cols += cp < 0 ? 1 : columns_of(cp);
  }
  return cols;
}

std::string fit_line(std::string_view line, size_t width) {
  if (display_width(line) <= width) return std::string(line);
  std::string out;
  bool escaped = false;
  size_t cols = 0;
  const size_t room = width == 0 ? 0 : width - 1;  // one column for the ellipsis
  for (size_t i = 0; i < line.size();) {
    if (line[i] == '\x1b') {
      const size_t n = escape_length(line, i);
      out.append(line.substr(i, n));
      escaped = true;
      i += n;
      continue;
    }
    const size_t start = i;
    const int32_t cp = decode_utf8(line, i);
    const size_t w = cp < 0 ? 1 : columns_of(cp);
    if (cols + w > room) break;
    out.append(line.substr(start, i - start));
    cols += w;
  }
  if (width > 0) out += "…";
  if (escaped) out += "\x1b[0m";
  return out;
}

std::string sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t start = i;
    const int32_t cp = decode_utf8(text, i);
    if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) {
      out += '?';
    } else {
      out.append(text.substr(start, i - start));
    }
  }
  return out;
}

std::vector<std::string> wrap_text(std::string_view text, size_t width) {
  std::vector<std::string> lines;
  if (width == 0) width = 1;
  std::string line;
  size_t line_w = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    while (pos < text.size() && text[pos] == ' ') ++pos;
    if (pos >= text.size()) break;
    size_t end = text.find(' ', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view word = text.substr(pos, end - pos);
    pos = end;
    size_t ww = display_width(word);
    if (line_w > 0 && line_w + 1 + ww <= width) {
      line += ' ';
      line += word;
      line_w += 1 + ww;
      continue;
    }
    if (line_w > 0) {
      lines.push_back(std::move(line));
      line.clear();
      line_w = 0;
    }
    // A word wider than the line is cut into pieces of `width` columns.
    while (ww > width) {
      std::string piece;
      size_t cols = 0, i = 0;
      while (i < word.size()) {
        size_t j = i;
        const int32_t cp = decode_utf8(word, j);
        const size_t w = cp < 0 ? 1 : columns_of(cp);
        if (cols + w > width && cols > 0) break;
        piece.append(word.substr(i, j - i));
        cols += w;
        i = j;
      }
      lines.push_back(std::move(piece));
      word = word.substr(i);
      ww = display_width(word);
    }
    line = std::string(word);
    line_w = ww;
  }
  if (line_w > 0 || lines.empty()) lines.push_back(std::move(line));
  return lines;
}

}  // namespace swarm::overwatch
