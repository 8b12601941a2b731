// The example agents as real binaries (examples/debug_agent, examples/multi_model_agent,
// examples/echo_agent) against real servers with the mock engine on ephemeral loopback
// ports, checked through the pool information and the batches the engines trained on.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/client_helpers.hpp"
#include "support/scratch_dir.hpp"
#include "support/test_server.hpp"
#include "swarm/swarm.hpp"

extern char** environ;

using namespace swarm;
using namespace std::chrono_literals;
using swarm::testing::fast_client;
using swarm::testing::ScratchDir;
using swarm::testing::TestServer;
using ::testing::HasSubstr;

namespace {

/// A child process with stdout and stderr in one file; killed if still running when destroyed.
class Child {
 public:
  Child(const std::string& binary, const std::vector<std::string>& args, std::filesystem::path log)
      : log_(std::move(log)) {
    std::vector<std::string> all{binary};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    // Not the servers' sockets: a child holding a listening socket would keep a stopped
    // server's port accepting connections.
    posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
    const int rc = ::posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("posix_spawn " + binary + ": " + std::strerror(rc));
    }
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  /// The exit code; -1 if it had not exited within `timeout` (it is killed then).
  int wait(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() >= until) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return -1;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  std::string output() const { return swarm::testing::read_file(log_); }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
};

/// The mock engine, with every generation taking a while: keeps model calls in flight
/// long enough to stop a server in the middle of one.
class SlowMockBackend : public MockBackend {
 public:
  void generate(GenerationRequest request, std::shared_ptr<GenerationObserver> observer) override {
    std::this_thread::sleep_for(150ms);
    MockBackend::generate(std::move(request), std::move(observer));
  }
};

nlohmann::json pool_info(const TestServer& server) {
  return SwarmClient(server.url(), fast_client()).get_pool_information();
}

/// (task_id, reward) of every episode of a batch, sorted.
std::vector<std::pair<std::string, double>> task_rewards(const TrainBatch& batch) {
  std::vector<std::pair<std::string, double>> v;
  for (const auto& e : batch.episodes) v.emplace_back(e.task_id, e.reward);
  std::sort(v.begin(), v.end());
  return v;
}

constexpr char kSpecial = '\x01';

/// The mock's byte tokens as text, its special tokens as kSpecial. With `generated_only`:
/// only the model-generated tokens, special ones left out.
std::string text_of(const Sample& s, bool generated_only) {
  std::string out;
  for (size_t i = 0; i < s.token_ids.size(); ++i) {
    if (generated_only && (!s.loss_mask[i] || s.token_ids[i] >= 256)) continue;
    out += s.token_ids[i] < 256 ? static_cast<char>(s.token_ids[i]) : kSpecial;
  }
  return out;
}

struct Summary {
  int committed = -1, aborted = -1, half_committed = -1;
};

/// The multi_model_agent's last summary line.
Summary summary_of(const std::string& output) {
  static const std::regex re(R"((\d+) rollouts ended on both servers, (\d+) aborted, (\d+) half-committed)");
  Summary s;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), re); it != std::sregex_iterator(); ++it)
    s = {std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[3])};
  return s;
}

class ExampleAgents : public ::testing::Test {
 protected:
  // The in-process servers write their run files under ./experiments: keep them in scratch.
  void SetUp() override {
    cwd_ = std::filesystem::current_path();
    std::filesystem::current_path(scratch_.path());
  }
  void TearDown() override { std::filesystem::current_path(cwd_); }

  std::filesystem::path next_log() { return scratch_.path() / ("agent-" + std::to_string(++runs_) + ".log"); }

  struct Result {
    int rc;
    std::string output;
  };
  Result run(const std::string& binary, const std::vector<std::string>& args) {
    Child child(binary, args, next_log());
    const int rc = child.wait(60s);
    return {rc, child.output()};
  }

  ScratchDir scratch_{"swarm-example-agents"};
  std::filesystem::path cwd_;
  int runs_ = 0;
};

TEST_F(ExampleAgents, DebugAgentAbortsEveryEpisodeAndLeavesTheBatchUntouched) {
  TestServer server;
  // It brings the OFFLINE server up itself (a batch of 2 tasks x 2 episodes) ...
  const Result first = run(SWARM_DEBUG_AGENT, {"--url", server.url(), "--episodes", "6", "--workers", "2",
                                               "--batch-size", "2", "--num-repeat", "2"});
  ASSERT_EQ(first.rc, 0) << first.output;
  EXPECT_THAT(first.output, HasSubstr("6 claimed, 6 aborted, 6 model calls, 0 errors"));
  nlohmann::json info = pool_info(server);
  EXPECT_EQ(info["engine_status"], "ENGINE.ROLLING");
  EXPECT_EQ(info["global_step"], 0);
  EXPECT_EQ(info["progress"]["finished_episodes"], 0) << info.dump();
  EXPECT_EQ(info["progress"]["complete_tasks"], 0);
  EXPECT_TRUE(info["tasks"].empty());
  EXPECT_TRUE(info["running_episodes"].empty());
  EXPECT_EQ(info["counters"]["claimed"], 6);
  EXPECT_EQ(info["counters"]["aborted"], 6);
  EXPECT_EQ(info["counters"]["ended"], 0);
  EXPECT_EQ(info["counters"]["llm_calls"], 6);  // the model really was called

  // ... and attaches to a running engine without reconfiguring it.
  const Result second =
      run(SWARM_DEBUG_AGENT, {"--url", server.url(), "--episodes", "3", "--no-configure", "--no-llm"});
  ASSERT_EQ(second.rc, 0) << second.output;
  EXPECT_THAT(second.output, HasSubstr("3 claimed, 3 aborted, 0 model calls, 0 errors"));
  info = pool_info(server);
  EXPECT_EQ(info["global_step"], 0);
  EXPECT_EQ(info["progress"]["finished_episodes"], 0);
  EXPECT_EQ(info["counters"]["aborted"], 9);
  EXPECT_EQ(info["counters"]["ended"], 0);
  EXPECT_TRUE(server.batches->copy().empty());

  // A training agent still fills and completes the step, with its own episodes only.
  const Result echo = run(SWARM_ECHO_AGENT, {"--url", server.url(), "--steps", "1", "--batch-size", "2",
                                             "--num-repeat", "2", "--workers", "4"});
  ASSERT_EQ(echo.rc, 0) << echo.output;
  EXPECT_THAT(echo.output, HasSubstr("step 1/1"));
  info = pool_info(server);
  EXPECT_EQ(info["global_step"], 1);
  EXPECT_EQ(info["counters"]["ended"], 4);
  const auto batches = server.batches->copy();
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0].episodes.size(), 4u);

  std::set<std::string> debug_episodes;
  static const std::regex claimed_re(R"(claimed ([0-9a-f-]{36}))");
  for (const std::string* out : {&first.output, &second.output})
    for (auto it = std::sregex_iterator(out->begin(), out->end(), claimed_re); it != std::sregex_iterator();
         ++it)
      debug_episodes.insert((*it)[1]);
  EXPECT_EQ(debug_episodes.size(), 9u) << first.output << second.output;
  for (const auto& e : batches[0].episodes)
    EXPECT_EQ(debug_episodes.count(e.episode_uuid), 0u) << e.episode_uuid;
}

// examples/tool_agent on the mock engine with scripted tool calls: every episode calls the
// calculator once, gets the right number back as the answer (reward 1), and trains as one
// sample of two calls (the server splices the generated ids of the tool-call turn).
TEST_F(ExampleAgents, ToolAgentRunsItsCalculatorLoopAndEachEpisodeIsOneSample) {
  TestServer server;
  const Result r = run(SWARM_TOOL_AGENT, {"--url", server.url(), "--model", "mock", "--scripted", "--steps",
                                          "2", "--batch-size", "2", "--num-repeat", "2", "--workers", "4",
                                          "--digits", "4", "--temperature", "0", "--max-tokens", "256"});
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("step 2/2"));
  static const std::regex step_re(
      R"(reward=([0-9.]+)  well_formed_call=([0-9.]+)  correct=([0-9.]+)  calls/episode=([0-9.]+)  turns/episode=([0-9.]+))");
  int steps = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), step_re);
       it != std::sregex_iterator(); ++it) {
    ++steps;
    EXPECT_EQ((*it)[1], "1.000") << r.output;
    EXPECT_EQ((*it)[2], "1.00");
    EXPECT_EQ((*it)[3], "1.00");
    EXPECT_EQ((*it)[4], "1.00");
    EXPECT_EQ((*it)[5], "2.00");
  }
  EXPECT_EQ(steps, 2) << r.output;
  const auto batches = server.batches->copy();
  ASSERT_EQ(batches.size(), 2u);
  for (const auto& b : batches)
    for (const auto& e : b.episodes) {
      ASSERT_EQ(e.samples.size(), 1u) << "the tool loop of episode " << e.episode_uuid << " split";
      EXPECT_EQ(e.samples[0].num_calls, 2);
      EXPECT_EQ(e.reward, 1.0);
    }
}

TEST_F(ExampleAgents, DebugAgentWithNoConfigureRefusesAnOfflineEngine) {
  TestServer server;
  const Result r = run(SWARM_DEBUG_AGENT, {"--url", server.url(), "--no-configure"});
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("OFFLINE and --no-configure"));
  EXPECT_EQ(server.engine().status().state, EngineState::OFFLINE);
  EXPECT_FALSE(server.engine().config().has_value());
}

TEST_F(ExampleAgents, MultiModelAgentTrainsBothModelsOnTheSameRollouts) {
  TestServer a, b;
  const Result r = run(SWARM_MULTI_MODEL_AGENT, {"--url-a", a.url(), "--url-b", b.url(), "--model-a",
                                                 "planner-test", "--model-b", "solver-test", "--steps", "2",
                                                 "--workers", "3", "--batch-size", "2", "--num-repeat", "2"});
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("step 1/2"));
  EXPECT_THAT(r.output, HasSubstr("step 2/2"));
  EXPECT_THAT(r.output, HasSubstr("8 rollouts ended on both servers, 0 aborted, 0 half-committed"));
  EXPECT_EQ(a.engine().config()->model, "planner-test");
  EXPECT_EQ(b.engine().config()->model, "solver-test");
  for (TestServer* s : {&a, &b}) {
    const auto st = s->engine().status();
    EXPECT_EQ(st.global_step, 2);
    EXPECT_EQ(st.counters.claimed, 8);
    EXPECT_EQ(st.counters.ended, 8);
    EXPECT_EQ(st.counters.aborted, 0);
    EXPECT_EQ(s->engine().pool_snapshot().running, 0);
  }

  // Each step trained both models on the same rollouts, with the same reward.
  const auto batches_a = a.batches->copy(), batches_b = b.batches->copy();
  ASSERT_EQ(batches_a.size(), 2u);
  ASSERT_EQ(batches_b.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(batches_a[k].episodes.size(), 4u);
    EXPECT_EQ(task_rewards(batches_a[k]), task_rewards(batches_b[k])) << "step " << k + 1;
  }
  // The solver's prompt carried the planner's reply.
  std::set<std::string> plans;
  for (const auto& batch : batches_a)
    for (const auto& e : batch.episodes)
      for (const auto& s : e.samples) plans.insert(text_of(s, /*generated_only=*/true));
  const std::string marker = "Planner's hint: ";
  int checked = 0;
  for (const auto& batch : batches_b)
    for (const auto& e : batch.episodes)
      for (const auto& s : e.samples) {
        const std::string text = text_of(s, /*generated_only=*/false);
        const size_t at = text.find(marker);
        ASSERT_NE(at, std::string::npos) << text;
        // The hint runs to the end of the user message (the next special token).
        const size_t from = at + marker.size();
        const std::string hint = text.substr(from, text.find(kSpecial, from) - from);
        EXPECT_EQ(plans.count(hint), 1u) << "hint '" << hint << "' is no planner reply";
        ++checked;
      }
  EXPECT_EQ(checked, 8);
}

TEST_F(ExampleAgents, MultiModelAgentAbortsBothEpisodesOfAFailedRollout) {
  TestServer a, b;
  // One worker and every 2nd rollout failing after both episodes were claimed and both
  // models called: per step, 4 rollouts end and 3 or 4 are aborted (each then retried).
  const Result r =
      run(SWARM_MULTI_MODEL_AGENT, {"--url-a", a.url(), "--url-b", b.url(), "--steps", "2", "--workers", "1",
                                    "--batch-size", "2", "--num-repeat", "2", "--fail-every", "2"});
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("8 rollouts ended on both servers, 7 aborted, 0 half-committed"));
  for (const TestServer* s : {&a, &b}) {
    const nlohmann::json info = pool_info(*s);
    EXPECT_EQ(info["global_step"], 2);
    EXPECT_EQ(info["counters"]["claimed"], 15) << info.dump();
    EXPECT_EQ(info["counters"]["ended"], 8);
    EXPECT_EQ(info["counters"]["aborted"], 7);
    EXPECT_EQ(info["counters"]["llm_calls"], 15);
    EXPECT_TRUE(info["running_episodes"].empty());
    EXPECT_EQ(info["slots"]["running"], 0);
  }
  const auto batches_a = a.batches->copy(), batches_b = b.batches->copy();
  ASSERT_EQ(batches_a.size(), 2u);
  ASSERT_EQ(batches_b.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(batches_a[k].episodes.size(), 4u);
    EXPECT_EQ(task_rewards(batches_a[k]), task_rewards(batches_b[k]));
  }
}

TEST_F(ExampleAgents, MultiModelAgentLosingServerBAbortsItsEpisodesOnServerA) {
  TestServer a;
  auto b = std::make_unique<TestServer>([] { return std::make_unique<SlowMockBackend>(); });
  Child agent(
      SWARM_MULTI_MODEL_AGENT,
      {"--url-a", a.url(), "--url-b", b->url(), "--steps", "1000", "--workers", "2", "--batch-size", "2",
       "--num-repeat", "2", "--claim-timeout", "1", "--request-timeout", "5", "--max-retries", "1"},
      next_log());
  // After a first step on both, stop B while one of its model calls is in flight: the
  // rollout making it also holds an episode on A.
  ASSERT_TRUE(b->engine().wait_for_step(1, 30s)) << agent.output();
  bool in_flight = false;
  for (auto until = std::chrono::steady_clock::now() + 20s;
       !in_flight && std::chrono::steady_clock::now() < until;) {
    for (const auto& e : b->engine().pool_snapshot().running_episodes) in_flight |= e.in_flight_calls > 0;
    if (!in_flight) std::this_thread::sleep_for(2ms);
  }
  ASSERT_TRUE(in_flight);
  b->server->stop();
  const int64_t ended_b = b->engine().status().counters.ended;

  const int rc = agent.wait(60s);
  const std::string output = agent.output();
  EXPECT_EQ(rc, 1) << output;
  const Summary summary = summary_of(output);
  ASSERT_GE(summary.committed, 4) << output;
  EXPECT_GE(summary.aborted, 1) << output;

  // Nothing left dangling on A, and A never kept a rollout B lost (except a reported
  // half-commit: B gone between the two end_episode calls).
  const nlohmann::json info = pool_info(a);
  EXPECT_TRUE(info["running_episodes"].empty()) << info.dump();
  EXPECT_EQ(info["slots"]["running"], 0);
  EXPECT_EQ(info["counters"]["aborted"], summary.aborted) << output;
  const int64_t ended_a = info["counters"]["ended"];
  EXPECT_GE(ended_a, ended_b);
  EXPECT_LE(ended_a, ended_b + summary.half_committed) << output;
  EXPECT_THAT(output, HasSubstr("error: step"));
}

}  // namespace
