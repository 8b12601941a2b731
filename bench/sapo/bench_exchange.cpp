// bench_exchange: the swarm exchange (SAPO) end to end through a real nats-server on loopback.
//
//   1. throughput: one node's Exchange publishes --groups task groups (8 episodes, a realistic
//      chat call each: ~4 KB), another node's Exchange pulls, validates and buffers them:
//      groups/s and MB/s each way; then re-encoding them for this node (mock ChatML template)
//      in groups/s.
//   2. flood: a hostile peer publishes --flood messages (valid groups, distinct rewards, ~1 KB)
//      as fast as NATS takes them while a node consumes: this process's RSS sampled throughout.
//      Target: memory flat — the RSS at the end within --rss-slack-mib of the RSS after the
//      first tenth of the flood (bounded buffer, bounded fetches, the stream's per-node cap).
//
//   bench_exchange [--groups 2000] [--flood 1000000] [--rss-slack-mib 32]
// Prints a table with the commit and the machine; never asserts on time.
#include <nats/nats.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "common/machine_info.hpp"
#include "engine/mock_backend.hpp"
#include "engine/sapo.hpp"
#include "exchange/exchange.hpp"

#include <spdlog/spdlog.h>

extern char** environ;
using namespace swarm;
using namespace swarm::bench;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// nats-server with JetStream on a free port, its store in a temp dir.
struct Broker {
  fs::path dir;
  pid_t pid = -1;
  int port = 0;
  Broker() {
    dir = fs::temp_directory_path() / ("bench-exchange-" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "ports");
    std::vector<std::string> args = {"nats-server",
                                     "-js",
                                     "-sd",
                                     (dir / "store").string(),
                                     "-a",
                                     "127.0.0.1",
                                     "-p",
                                     "-1",
                                     "--ports_file_dir",
                                     (dir / "ports").string(),
                                     "-l",
                                     (dir / "log").string()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid, "nats-server", nullptr, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("cannot start nats-server (scripts/setup.sh installs it)");
    for (int k = 0; k < 400 && port == 0; ++k) {
      for (const auto& f : fs::directory_iterator(dir / "ports")) {
        const std::string text = read_first_line(f.path());
        const auto colon = text.rfind(':'), end = text.find('"', colon == std::string::npos ? 0 : colon);
        if (colon != std::string::npos && end != std::string::npos)
          port = std::stoi(text.substr(colon + 1, end - colon - 1));
      }
      if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    if (port == 0) throw std::runtime_error("nats-server did not start (" + (dir / "log").string() + ")");
  }
  ~Broker() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      int st = 0;
      waitpid(pid, &st, 0);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port); }
};

SapoGroup make_group(const std::string& node, int index, int episodes, size_t text_bytes) {
  SapoGroup g;
  g.node_id = node;
  g.model = "tiny-char";
  g.policy_step = index;
  g.created = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  g.task_id = "task-" + std::to_string(index);
  const std::string question(text_bytes, 'q');
  for (int e = 0; e < episodes; ++e) {
    SapoEpisode ep;
    ep.reward = e % 2;
    const std::string answer = "answer " + std::to_string(e) + std::string(text_bytes / 4, 'a');
    ep.calls.push_back(
        {{"messages", nlohmann::ordered_json::array({{{"role", "system"}, {"content", "Be brief."}},
                                                     {{"role", "user"}, {"content", question}}})},
         {"completion", {{"role", "assistant"}, {"content", answer}}},
         {"text", answer + "<|im_end|>"},
         {"finish_reason", "stop"}});
    g.episodes.push_back(std::move(ep));
  }
  return g;
}

template <class Pred>
bool wait_until(Pred pred, double seconds) {
  const auto t0 = Clock::now();
  while (!pred()) {
    if (since(t0) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

std::string commit() {
  FILE* p = popen("git -C " SWARM_SOURCE_DIR " rev-parse --short HEAD 2>/dev/null", "r");
  if (p == nullptr) return "?";
  char buf[64] = {0};
  const bool ok = std::fgets(buf, sizeof buf, p) != nullptr;
  pclose(p);
  std::string s = ok ? buf : "?";
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_exchange: swarm experience sharing through a real nats-server"};
  int groups = 2000;
  int64_t flood = 1000000;
  double slack_mib = 32;
  app.add_option("--groups", groups, "Groups for the throughput run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--flood", flood, "Messages the hostile peer publishes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--rss-slack-mib", slack_mib, "Allowed RSS growth over the flood (target)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);
  Broker broker;
  std::printf("bench_exchange: commit %s; %s, %ld CPUs; nats-server %s on loopback; loadavg %s\n",
              commit().c_str(), cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), broker.url().c_str(),
              load_average().c_str());

  // ---- 1. throughput
  ExchangeConfig pc;
  pc.url = broker.url();
  pc.swarm_name = "bench";
  pc.node_id = "producer";
  pc.consume = false;
  pc.max_message_bytes = 4 << 20;
  ExchangeConfig cc = pc;
  cc.node_id = "consumer";
  cc.consume = true;
  cc.publish = false;
  cc.buffer_groups = groups;
  std::vector<SapoGroup> batch;
  for (int k = 0; k < groups; ++k) batch.push_back(make_group("producer", k, 8, 300));
  const size_t bytes = encode_sapo_group(batch.front()).size();
  double publish_s = 0, consume_s = 0, reencode_s = 0;
  int64_t reencoded = 0;
  {
    Exchange producer(pc);
    Exchange consumer(cc);
    if (!wait_until([&] { return producer.status().ready && consumer.status().ready; }, 20))
      throw std::runtime_error("the exchanges did not get ready: " + producer.status().last_error);
    const auto t0 = Clock::now();
    for (const SapoGroup& g : batch) {
      wait_until([&] { return producer.status().outbox < 48; }, 30);  // never overflow the outbox
      producer.publish(g);
    }
    wait_until([&] { return producer.status().published >= groups; }, 120);
    publish_s = since(t0);
    if (!consumer.wait_buffered(static_cast<size_t>(groups), 120))
      std::printf("warning: consumer got %ld of %d\n", static_cast<long>(consumer.status().buffered), groups);
    consume_s = since(t0);
    std::mt19937_64 rng(1);
    const std::vector<SapoGroup> drawn = consumer.draw(static_cast<size_t>(groups), rng);
    MockBackend backend;
    const auto t1 = Clock::now();
    for (const SapoGroup& g : drawn)
      reencoded += static_cast<int64_t>(reencode_sapo_group(g, backend, 1, 1 << 20).size());
    reencode_s = since(t1);
  }
  std::printf("\n| throughput (%d groups of 8 episodes, %.1f KB each) | groups/s | MB/s |\n|---|---:|---:|\n",
              groups, static_cast<double>(bytes) / 1000.0);
  std::printf("| published (JetStream ack each) | %.0f | %.1f |\n", groups / publish_s,
              groups * bytes / publish_s / 1e6);
  std::printf("| published + consumed, validated, buffered | %.0f | %.1f |\n", groups / consume_s,
              groups * bytes / consume_s / 1e6);
  std::printf("| re-encoded for this node (mock ChatML) | %.0f | %.1f |\n", groups / reencode_s,
              groups * bytes / reencode_s / 1e6);

  // ---- 2. flood
  ExchangeConfig vc = cc;
  vc.swarm_name = "flood";
  vc.node_id = "victim";
  vc.buffer_groups = 256;
  Exchange victim(vc);
  if (!wait_until([&] { return victim.status().ready; }, 20)) throw std::runtime_error("victim not ready");
  natsConnection* nc = nullptr;
  if (natsConnection_ConnectTo(&nc, broker.url().c_str()) != NATS_OK)
    throw std::runtime_error("flooder cannot connect");
  // Distinct groups, each under its own Nats-Msg-Id (a repeated group is a duplicate, and a
  // message without its id is dropped before it is buffered): every one reaches the buffer.
  SapoGroup flood_group = make_group("flooder", 0, 2, 200);
  flood_group.run = "flood0";
  std::vector<std::string> payloads = {encode_sapo_group(flood_group)};
  const int64_t rss0 = proc_status_kib("VmRSS");
  int64_t rss_tenth = -1, rss_max = rss0;
  const auto t0 = Clock::now();
  for (int64_t k = 0; k < flood; ++k) {
    flood_group.policy_step = k;
    const std::string p = encode_sapo_group(flood_group);
    const std::string id = sapo_message_id(flood_group);
    natsMsg* msg = nullptr;
    if (natsMsg_Create(&msg, "swarm.flood.groups.flooder", nullptr, p.data(), static_cast<int>(p.size())) ==
        NATS_OK) {
      natsMsgHeader_Set(msg, "Nats-Msg-Id", id.c_str());
      natsConnection_PublishMsg(nc, msg);
      natsMsg_Destroy(msg);
    }
    if (k % 10000 == 0) {
      natsConnection_Flush(nc);  // keep the flooder itself bounded
      const int64_t rss = proc_status_kib("VmRSS");
      rss_max = std::max(rss_max, rss);
      if (k >= flood / 10 && rss_tenth < 0) rss_tenth = rss;
    }
  }
  natsConnection_Flush(nc);
  const double flood_s = since(t0);
  std::this_thread::sleep_for(std::chrono::seconds(3));  // the consumer drains what the stream kept
  const ExchangeStatus vs = victim.status();
  const int64_t rss_end = proc_status_kib("VmRSS");
  rss_max = std::max(rss_max, rss_end);
  natsConnection_Destroy(nc);
  if (rss_tenth < 0) rss_tenth = rss0;
  const double growth_mib = static_cast<double>(rss_end - rss_tenth) / 1024.0;
  std::printf("\n| flood: %lld messages of %.1f KB from one peer | value |\n|---|---:|\n",
              static_cast<long long>(flood), static_cast<double>(payloads[0].size()) / 1000.0);
  std::printf("| published in | %.1f s (%.0f msg/s) |\n", flood_s, static_cast<double>(flood) / flood_s);
  std::printf("| received by the node (the stream keeps 10000 per node) | %lld |\n",
              static_cast<long long>(vs.received));
  std::printf("| buffered (bound 256) / evicted | %lld / %lld |\n", static_cast<long long>(vs.buffered),
              static_cast<long long>(vs.dropped.count("evicted") ? vs.dropped.at("evicted") : 0));
  std::printf("| RSS before / after a tenth / max / end (MiB) | %.1f / %.1f / %.1f / %.1f |\n", rss0 / 1024.0,
              rss_tenth / 1024.0, rss_max / 1024.0, rss_end / 1024.0);
  std::printf("| memory flat (end - tenth <= %.0f MiB) | %.1f MiB: %s |\n", slack_mib, growth_mib,
              growth_mib <= slack_mib ? "target met" : "target MISSED");
  return 0;
}
