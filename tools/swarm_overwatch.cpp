// swarm-overwatch: a terminal monitor of a running swarm-server.
//
//   swarm-overwatch                          # full screen, http://127.0.0.1:10086, every second
//   swarm-overwatch --url http://gpu-box:10086 --interval 2
//   swarm-overwatch --once --no-color        # one frame on stdout (exit 1 if unreachable)
//
// Polls /get_current_batch_rollout_pool_information (plus /get_engine_status and /metrics)
// and draws engine state, batch progress, running episodes, task rewards, a reward
// sparkline and traffic. See docs/overwatch.md.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <string>

#include "overwatch/monitor.hpp"
#include "common/env.hpp"
#include "overwatch/poller.hpp"
#include "overwatch/render.hpp"
#include "overwatch/terminal.hpp"

namespace {

using namespace swarm::overwatch;
using SteadyClock = std::chrono::steady_clock;

std::string wall_clock() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  return buf;
}

int run_once(Poller& poller, double interval, bool color) {
  Monitor monitor(poller.url(), interval);
  PollResult r = poller.poll();
  if (!r.snapshot) {
    std::fprintf(stderr, "swarm-overwatch: cannot reach the swarm server at %s: %s\n", poller.url().c_str(),
                 r.error.c_str());
    return 1;
  }
  monitor.on_poll_ok(std::move(*r.snapshot), SteadyClock::now());
  FrameInput frame = monitor.frame(SteadyClock::now());
  frame.clock = wall_clock();
  RenderOptions options;
  options.width = ::isatty(1) ? terminal_columns(1) : 100;
  options.color = color;
  options.interactive = false;
  for (const auto& line : render_frame(frame, options)) std::printf("%s\n", line.c_str());
  return 0;
}

int run_screen(Poller& poller, double interval, bool color) {
  Monitor monitor(poller.url(), interval);
  TerminalSession term;
  const auto period = std::chrono::milliseconds(static_cast<int64_t>(interval * 1000));
  auto draw = [&] {
    FrameInput frame = monitor.frame(SteadyClock::now());
    frame.clock = wall_clock();
    RenderOptions options;
    options.width = term.columns();
    options.height = term.rows();
    options.color = color;
    options.interactive = true;
    term.draw(render_frame(frame, options));
  };
  while (!term.quit_requested()) {
    const auto next_poll = SteadyClock::now() + period;
    PollResult r = poller.poll();
    if (term.quit_requested()) break;
    if (r.snapshot) {
      monitor.on_poll_ok(std::move(*r.snapshot), SteadyClock::now());
    } else {
      monitor.on_poll_failed(std::move(r.error), SteadyClock::now());
    }
    draw();
    // Between polls the screen is redrawn every second (the clocks keep moving) and at
    // once on a resize; r or space polls now.
    for (;;) {
      const auto now = SteadyClock::now();
      if (now >= next_poll) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_poll - now);
      const auto ev = term.wait(std::min(left, std::chrono::milliseconds(1000)));
      if (ev == TerminalSession::Event::QUIT) return 0;
      if (ev == TerminalSession::Event::REFRESH) break;
      draw();
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swarm-overwatch: a terminal monitor of a running swarm-server"};
  std::string url = "http://127.0.0.1:10086";
  double interval = 1.0;
  bool once = false, no_color = false;
  app.add_option("--url", url,
                 "Swarm server URL, http:// or https:// (a server with a private or self-signed certificate: "
                 "set SWARM_CA_FILE to its CA or certificate file)")
      ->capture_default_str();
  app.add_option("--interval", interval, "Seconds between polls")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_flag("--once", once,
               "Print one frame to stdout (no screen control) and exit: 0 if the server answered");
  app.add_flag("--no-color", no_color, "No ANSI colours (also: the NO_COLOR environment variable)");
  CLI11_PARSE(app, argc, argv);

  const bool env_no_color = swarm::env_value("NO_COLOR").has_value();
  // Each request may take up to the poll interval, within [1 s, 5 s].
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(std::clamp(interval, 1.0, 5.0) * 1000));
  try {
    Poller poller(url, timeout);
    if (once) return run_once(poller, interval, !no_color && !env_no_color && ::isatty(1));
    return run_screen(poller, interval, !no_color && !env_no_color);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "swarm-overwatch: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swarm-overwatch: unexpected error: %s\n", e.what());
    return 1;
  }
}
