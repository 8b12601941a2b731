// End-to-end: a real server on a loopback port, driven by the real client SDK.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "support/client_helpers.hpp"
#include "support/scratch_dir.hpp"
#include "support/test_server.hpp"
#include "swarm/swarm.hpp"

using namespace swarm;
using namespace std::chrono_literals;
using swarm::testing::fast_client;
using swarm::testing::reward;
using swarm::testing::task;
using swarm::testing::TestServer;

namespace {

Job small_job(int batch_size, int num_repeat) {
  Job job;
  job.model = "mock-model";
  job.batch_size = batch_size;
  job.num_repeat = num_repeat;
  return job;
}

TEST(ServerIntegration, ThirtyTwoConcurrentClientsThroughSeveralCycles) {
  TestServer server;
  SwarmClient admin(server.url(), fast_client());
  admin.auto_sync_train_config_and_start_engine(small_job(4, 4));
  constexpr int kSteps = 3;
  std::atomic<int64_t> next_episode{0};
  std::atomic<int> errors{0};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 32; ++t) {
    threads.emplace_back([&, t] {
      SwarmClient client(server.url(), fast_client());
      while (!done) {
        try {
          OpenAIEndpoint ep = client.begin_episode(60, "train", 20s);
          OpenAIClient llm(ep);
          const int64_t k = next_episode++;
          ChatResult r = llm.chat({{"user", "hello from " + std::to_string(t)}});
          if (r.content.empty()) ++errors;
          // Rewards vary within a group so every group carries signal.
          client.end_episode(task("task-" + std::to_string(k / 4)), ep.episode_uuid,
                             reward(static_cast<double>(k % 4)));
        } catch (const TimeoutError&) {
          // done may have been set while waiting
        } catch (const std::exception& e) {
          ++errors;
          ADD_FAILURE() << "thread " << t << ": " << e.what();
          return;
        }
        if (admin.get_engine_status().global_step >= kSteps) done = true;
      }
    });
  }
  bool reached = server.engine().wait_for_step(kSteps, 60s);
  done = true;
  for (auto& th : threads) th.join();
  ASSERT_TRUE(reached);
  EXPECT_EQ(errors, 0);
  auto batches = server.batches->copy();
  ASSERT_GE(batches.size(), static_cast<size_t>(kSteps));
  for (const auto& b : batches) {
    EXPECT_GE(b.num_tasks, 4);
    for (const auto& e : b.episodes) {
      EXPECT_EQ(e.samples.size(), 1u);
      EXPECT_FALSE(e.samples[0].token_ids.empty());
    }
  }
  auto st = server.engine().status();
  EXPECT_EQ(st.counters.claimed, st.counters.ended + st.counters.aborted + st.counters.timed_out +
                                     st.counters.cancelled + server.engine().pool_snapshot().running);
}

TEST(ServerIntegration, DebugClientThatAlwaysAbortsLeavesTheBatchUnchanged) {
  TestServer server;
  SwarmClient trainer(server.url(), fast_client());
  trainer.auto_sync_train_config_and_start_engine(small_job(2, 2));
  std::atomic<bool> stop{false};
  std::atomic<int> debug_aborts{0};
  std::thread debug([&] {
    SwarmClient dbg(server.url(), fast_client());
    while (!stop) {
      try {
        OpenAIEndpoint ep = dbg.begin_episode(60, "train", 200ms);
        OpenAIClient(ep).chat({{"user", "debugging"}});
        dbg.abort_episode(ep.episode_uuid);
        ++debug_aborts;
      } catch (const TimeoutError&) {}
    }
  });
  // Wait until the debug client is active, then complete one batch.
  for (int i = 0; i < 400 && debug_aborts < 3; ++i) std::this_thread::sleep_for(5ms);
  std::vector<std::string> ended;
  for (int i = 0; i < 4; ++i) {
    OpenAIEndpoint ep = trainer.begin_episode(60, "train", 10s);
    OpenAIClient(ep).chat({{"user", "train " + std::to_string(i)}});
    ASSERT_TRUE(trainer.end_episode(task(i < 2 ? "a" : "b"), ep.episode_uuid, reward(i % 2)));
    ended.push_back(ep.episode_uuid);
  }
  ASSERT_TRUE(server.engine().wait_for_step(1, 10s));
  stop = true;
  debug.join();
  EXPECT_GE(debug_aborts, 3);
  auto batches = server.batches->copy();
  ASSERT_EQ(batches.size(), 1u);
  std::vector<std::string> trained;
  for (const auto& e : batches[0].episodes) trained.push_back(e.episode_uuid);
  std::sort(trained.begin(), trained.end());
  std::sort(ended.begin(), ended.end());
  EXPECT_EQ(trained, ended);  // exactly the trainer's episodes, none of the debug ones
}

TEST(ServerIntegration, KilledClientIsReclaimedAfterItsTimeoutAndTrainingGoesOn) {
  TestServer server(/*janitor_interval_seconds=*/0.02);
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(small_job(1, 2));
  {
    // A client that claims, makes one call and dies (never ends or aborts).
    SwarmClient doomed(server.url(), fast_client());
    OpenAIEndpoint ep = doomed.begin_episode(0.4, "train");
    OpenAIClient(ep).chat({{"user", "about to crash"}});
  }
  for (int i = 0; i < 2; ++i) {
    OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
    client.end_episode(task("t"), ep.episode_uuid, reward(i));
  }
  EXPECT_EQ(client.get_engine_status().engine_status, "ENGINE.ROLLING_POST");
  ASSERT_TRUE(server.engine().wait_for_step(1, 10s));
  EXPECT_EQ(server.engine().status().counters.timed_out, 1);
  // The next cycle works normally.
  for (int i = 0; i < 2; ++i) {
    OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
    client.end_episode(task("u"), ep.episode_uuid, reward(i));
  }
  EXPECT_TRUE(server.engine().wait_for_step(2, 10s));
}

// The SDK's OpenAI client in a whole tool loop (the mock answers the scripted call, then
// the tool's output), non-streamed and streamed; the episode trains as one sample.
TEST(ServerIntegration, OpenAIClientRunsAToolLoop) {
  TestServer server;
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(small_job(1, 2));
  ChatParams params;
  params.temperature = 0;
  params.tools = nlohmann::json::array(
      {{{"type", "function"}, {"function", {{"name", "add"}, {"parameters", {{"type", "object"}}}}}}});
  const std::string scripted = R"(<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>)";
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "non-streamed");
    OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
    OpenAIClient llm(ep);
    nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", scripted}}});
    auto ask = [&] {
      return stream ? llm.chat_stream(messages, nullptr, params) : llm.chat(messages, params);
    };
    ChatResult r = ask();
    EXPECT_EQ(r.finish_reason, "tool_calls");
    EXPECT_EQ(r.content, "");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].name, "add");
    EXPECT_FALSE(r.tool_calls[0].id.empty());
    const auto args = nlohmann::json::parse(r.tool_calls[0].arguments);
    messages.push_back(r.assistant_message());
    EXPECT_TRUE(messages.back()["content"].is_null());
    messages.push_back(ChatResult::tool_message(r.tool_calls[0],
                                                std::to_string(args["a"].get<int>() + args["b"].get<int>())));
    r = ask();
    EXPECT_EQ(r.finish_reason, "stop");
    EXPECT_EQ(r.content, "5");
    EXPECT_TRUE(r.tool_calls.empty());
    client.end_episode(task("t"), ep.episode_uuid, reward(1));
  }
  ASSERT_TRUE(server.engine().wait_for_step(1, 10s));
}

// An agent's SDK sends the server's tool calls back re-serialized (arguments
// without the generated spaces, keys reordered, content "" instead of null). With
// exact_history_tokens (default) the three calls still make one sample: each prompt continues
// from the ids generated before it, the loss mask is 1 exactly on generated ids. With it off,
// the re-rendered history differs, the calls split into three samples and the episode is
// counted as split by drift.
TEST(ServerIntegration, ReserializedToolLoopTrainsAsOneSampleTokenByToken) {
  for (bool exact : {true, false}) {
    SCOPED_TRACE(exact ? "exact_history_tokens" : "fresh renders");
    TestServer server;
    SwarmClient client(server.url(), fast_client());
    Job job = small_job(1, 1);
    job.exact_history_tokens = exact;
    client.auto_sync_train_config_and_start_engine(job);
    OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
    OpenAIClient llm(ep);
    ChatParams params;
    params.temperature = 0;
    params.tools = nlohmann::json::array(
        {{{"type", "function"}, {"function", {{"name", "add"}, {"parameters", {{"type", "object"}}}}}},
         {{"type", "function"}, {"function", {{"name", "mul"}, {"parameters", {{"type", "object"}}}}}}});
    // The mock answers with the last user / tool message: turn 1 calls add, the add tool's
    // (scripted) result makes turn 2 call mul, the mul result "20" is turn 3's answer.
    const std::string call_add = R"(<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>)";
    const std::string call_mul = R"(<tool_call>{"name": "mul", "arguments": {"x": 5, "y": 4}}</tool_call>)";
    nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", call_add}}});
    std::vector<std::string> env;  // what the agent added after each answer, as rendered text
    for (const std::string& result : {call_mul, std::string("20")}) {
      ChatResult r = llm.chat(messages, params);
      ASSERT_EQ(r.tool_calls.size(), 1u) << r.content;
      nlohmann::json assistant = r.assistant_message();
      // Re-serialized as JSON.stringify does (no spaces), keys in reverse order, content "".
      nlohmann::json args = nlohmann::json::parse(r.tool_calls[0].arguments);
      nlohmann::ordered_json reordered = nlohmann::ordered_json::object();
      for (auto it = args.rbegin(); it != args.rend(); ++it) reordered[it.key()] = it.value();
      assistant["tool_calls"][0]["function"]["arguments"] = reordered.dump();
      assistant["content"] = "";
      messages.push_back(assistant);
      messages.push_back(ChatResult::tool_message(r.tool_calls[0], result));
      env.push_back("\n<|im_start|>tool\n" + result + "<|im_end|>\n<|im_start|>assistant\n");
    }
    ChatResult last = llm.chat(messages, params);
    EXPECT_EQ(last.content, "20");
    client.end_episode(task("tools"), ep.episode_uuid, reward(1));
    ASSERT_TRUE(server.engine().wait_for_step(1, 10s));
    const auto batches = server.batches->copy();
    ASSERT_EQ(batches.size(), 1u);
    const auto& samples = batches[0].episodes.at(0).samples;
    if (!exact) {
      EXPECT_EQ(samples.size(), 3u) << "re-rendered tool calls differ from the generated ids";
      EXPECT_EQ(server.engine().pool_snapshot().counters.episodes_split_by_drift, 1);
      continue;
    }
    ASSERT_EQ(samples.size(), 1u);
    EXPECT_EQ(server.engine().pool_snapshot().counters.episodes_split_by_drift, 0);
    // Expected: the first prompt (tools, user), then per turn the generated ids (mask 1) and
    // what the agent added (mask 0).
    MockBackend tok;
    const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(params.tools.dump());
    std::vector<TokenId> expected = tok.render_chat(
        nlohmann::ordered_json::array({{{"role", "user"}, {"content", call_add}}}), tools, true);
    std::vector<uint8_t> mask(expected.size(), 0);
    const std::string generated[] = {call_add, call_mul, "20"};
    for (int turn = 0; turn < 3; ++turn) {
      for (TokenId id : tok.encode(generated[turn])) expected.push_back(id), mask.push_back(1);
      expected.push_back(MockBackend::kImEnd), mask.push_back(1);
      if (turn < 2)
        for (TokenId id : tok.encode_rendered(env[turn])) expected.push_back(id), mask.push_back(0);
    }
    const Sample& s = samples[0];
    EXPECT_EQ(s.num_calls, 3);
    ASSERT_EQ(s.token_ids.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(s.token_ids[i], expected[i]) << "token " << i;
      EXPECT_EQ(s.loss_mask[i], mask[i]) << "mask " << i;
    }
  }
}

TEST(ServerIntegration, StopEngineMidRolloutThenRestart) {
  TestServer server;
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(small_job(1, 2));
  OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
  OpenAIClient llm(ep);
  llm.chat({{"user", "hi"}});
  client.stop_engine();
  EXPECT_EQ(client.get_engine_status().engine_status, "ENGINE.OFFLINE");
  EXPECT_FALSE(client.can_continue_episode(ep.episode_uuid));
  EXPECT_THROW(llm.chat({{"user", "still there?"}}), ServerError);
  try {
    client.end_episode(task("t"), ep.episode_uuid, reward(1));
    FAIL() << "ending a cancelled episode must fail";
  } catch (const ServerError& e) {
    EXPECT_EQ(e.status(), 404);
  }
  client.auto_sync_train_config_and_start_engine(small_job(1, 2));
  EXPECT_EQ(client.get_engine_status().engine_status, "ENGINE.ROLLING");
  for (int i = 0; i < 2; ++i) {
    OpenAIEndpoint e2 = client.begin_episode(60, "train", 10s);
    OpenAIClient(e2).chat({{"user", "again"}});
    client.end_episode(task("t"), e2.episode_uuid, reward(i));
  }
  EXPECT_TRUE(server.engine().wait_for_step(1, 10s));
}

// The SDK's start_engine(resume) over HTTP: the run goes on at its checkpoint, same run id.
TEST(ServerIntegration, StartEngineResumeContinuesTheRunOverHttp) {
  swarm::testing::ScratchDir dir("swarm-resume");  // its own experiment directory: tests run side by side
  TestServer server;
  SwarmClient client(server.url(), fast_client());
  Job job = small_job(1, 1);
  job.experiment_dir = dir.path().string();
  client.auto_sync_train_config_and_start_engine(job);
  OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
  OpenAIClient(ep).chat({{"user", "hi"}});
  client.end_episode(task("t"), ep.episode_uuid, reward(1));
  ASSERT_TRUE(server.engine().wait_for_step(1, 10s));
  ASSERT_TRUE(server.engine().wait_for_state(EngineState::ROLLING, 10s));
  const nlohmann::json before = client.get_pool_information();
  ASSERT_TRUE(before.contains("run"));
  client.stop_engine();
  client.start_engine(/*resume=*/true);
  ASSERT_TRUE(server.engine().wait_for_state(EngineState::ROLLING, 10s));
  const nlohmann::json after = client.get_pool_information();
  EXPECT_EQ(after["global_step"], 1);
  EXPECT_EQ(after["run"]["run_id"], before["run"]["run_id"]);
  EXPECT_EQ(after["counters"]["run_id"], before["run"]["run_id"]);
  EXPECT_TRUE(after["run"]["resumed_from"].is_string());
  client.stop_engine();
  client.start_engine();  // fresh: a new run at step 0
  ASSERT_TRUE(server.engine().wait_for_state(EngineState::ROLLING, 10s));
  const nlohmann::json fresh = client.get_pool_information();
  EXPECT_EQ(fresh["global_step"], 0);
  EXPECT_NE(fresh["run"]["run_id"], before["run"]["run_id"]);
  EXPECT_TRUE(fresh["step_history"].empty());
}

TEST(ServerIntegration, TwoConfigsSyncedLastWins) {
  TestServer server;
  SwarmClient a(server.url(), fast_client());
  SwarmClient b(server.url(), fast_client());
  a.sync_train_config(small_job(1, 1));
  b.sync_train_config(small_job(3, 2));
  a.start_engine();
  for (int i = 0; i < 200 && a.get_engine_status().engine_status != "ENGINE.ROLLING"; ++i)
    std::this_thread::sleep_for(5ms);
  auto info = a.get_pool_information();
  EXPECT_EQ(info["batch_size"], 3);
  EXPECT_EQ(info["num_repeat"], 2);
  EXPECT_EQ(info["targets"]["tasks"], 3);
}

TEST(ServerIntegration, AutoSyncIsIdempotentWhileRolling) {
  TestServer server;
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(small_job(1, 2));
  OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
  client.auto_sync_train_config_and_start_engine(small_job(5, 5));  // no-op: already rolling
  EXPECT_TRUE(client.can_continue_episode(ep.episode_uuid));
  EXPECT_EQ(client.get_pool_information()["batch_size"], 1);
  client.auto_sync_train_config_and_start_engine(small_job(5, 5), /*force_restart=*/true);
  EXPECT_EQ(client.get_pool_information()["batch_size"], 5);
  EXPECT_FALSE(client.can_continue_episode(ep.episode_uuid));
}

TEST(ServerIntegration, StreamingAndNonStreamingAgree) {
  TestServer server;
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(small_job(1, 1));
  OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
  OpenAIClient llm(ep);
  ChatParams p;
  p.seed = 7;
  p.temperature = 1.0;
  nlohmann::json messages =
      nlohmann::json::array({{{"role", "user"}, {"content", "Stream me — naïve 日本語 text"}}});
  ChatResult plain = llm.chat(messages, p);
  std::string streamed;
  int deltas = 0;
  ChatResult s = llm.chat_stream(
      messages,
      [&](std::string_view d) {
        streamed += d;
        ++deltas;
      },
      p);
  EXPECT_EQ(streamed, plain.content);
  EXPECT_EQ(s.content, plain.content);
  EXPECT_EQ(s.finish_reason, "stop");
  EXPECT_GT(deltas, 1);
  EXPECT_EQ(plain.usage.completion_tokens, plain.usage.total_tokens - plain.usage.prompt_tokens);
}

TEST(ServerIntegration, ThreeTurnConversationMergesIntoOneSampleTokenByToken) {
  TestServer server;
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(small_job(1, 1));
  OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
  OpenAIClient llm(ep);
  nlohmann::json messages = nlohmann::json::array();
  std::vector<std::string> replies;
  for (const char* user : {"first question", "second question", "third question"}) {
    messages.push_back({{"role", "user"}, {"content", user}});
    ChatResult r = llm.chat(messages);
    replies.push_back(r.content);
    messages.push_back({{"role", "assistant"}, {"content", r.content}});
  }
  client.end_episode(task("conv"), ep.episode_uuid, reward(1));
  ASSERT_TRUE(server.engine().wait_for_step(1, 10s));
  auto batches = server.batches->copy();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].episodes.size(), 1u);
  const auto& samples = batches[0].episodes[0].samples;
  ASSERT_EQ(samples.size(), 1u) << "three turns of one conversation are one timeline";
  const Sample& s = samples[0];
  // Expected: the template rendering of the whole conversation, where each assistant
  // turn is exactly the generated ids (text bytes + <|im_end|>) and only those are masked in.
  MockBackend tok;
  std::vector<TokenId> expected;
  std::vector<uint8_t> mask;
  auto add = [&](const std::string& text, uint8_t m) {
    for (unsigned char c : text) {
      expected.push_back(c);
      mask.push_back(m);
    }
  };
  auto special = [&](TokenId id, uint8_t m) {
    expected.push_back(id);
    mask.push_back(m);
  };
  const char* users[] = {"first question", "second question", "third question"};
  for (int turn = 0; turn < 3; ++turn) {
    if (turn > 0) add("\n", 0);  // template's newline after the previous <|im_end|>
    special(MockBackend::kImStart, 0);
    add(std::string("user\n") + users[turn], 0);
    special(MockBackend::kImEnd, 0);
    add("\n", 0);
    special(MockBackend::kImStart, 0);
    add("assistant\n", 0);
    add(replies[turn], 1);
    special(MockBackend::kImEnd, 1);
  }
  ASSERT_EQ(s.token_ids.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(s.token_ids[i], expected[i]) << "token " << i;
    EXPECT_EQ(s.loss_mask[i], mask[i]) << "mask " << i;
    if (mask[i]) {
      EXPECT_LT(s.rollout_logprobs[i], 0.0f);
      EXPECT_EQ(s.policy_versions[i], 0);
    } else {
      EXPECT_EQ(s.policy_versions[i], -1);
    }
  }
  EXPECT_EQ(s.num_calls, 3);
}

TEST(ServerIntegration, EvalEpisodesReportMetricsButNeverTrain) {
  TestServer server;
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(small_job(1, 1));
  OpenAIEndpoint ev = client.begin_episode(60, "eval", 10s);
  WorkflowOutput out = reward(0.25);
  out.log_metrics["accuracy"] = 0.5;
  client.end_episode(task("e"), ev.episode_uuid, out);
  auto info = client.get_pool_information();
  EXPECT_EQ(client.get_engine_status().engine_status, "ENGINE.ROLLING");
  EXPECT_DOUBLE_EQ(info["eval_metrics"]["eval/reward_mean"].get<double>(), 0.25);
  OpenAIEndpoint tr = client.begin_episode(60, "train", 10s);
  client.end_episode(task("t"), tr.episode_uuid, reward(1));
  ASSERT_TRUE(server.engine().wait_for_step(1, 10s));
  auto batches = server.batches->copy();
  ASSERT_EQ(batches[0].episodes.size(), 1u);
  EXPECT_EQ(batches[0].episodes[0].episode_uuid, tr.episode_uuid);
}

TEST(ServerIntegration, RunEpisodesUntilAllCompleteDrivesAFullStep) {
  TestServer server;
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(small_job(2, 3));
  std::vector<Task> tasks;
  for (int i = 0; i < 6; ++i) tasks.push_back(task(i < 3 ? "x" : "y"));
  std::atomic<int> calls{0};
  RunSummary summary = client.run_episodes_until_all_complete(
      tasks,
      [&](const Task& t, const OpenAIEndpoint& ep) {
        if (calls++ == 0) throw std::runtime_error("flaky environment");  // retried
        ChatResult r = OpenAIClient(ep).chat({{"user", t.main_query}});
        return reward(r.content.size() % 3 == 0 ? 1.0 : 0.0);
      },
      4, 3);
  EXPECT_EQ(summary.completed, 6u);
  EXPECT_EQ(summary.failed, 0u);
  EXPECT_EQ(summary.retries, 1u);
  EXPECT_TRUE(server.engine().wait_for_step(1, 10s));
  EXPECT_EQ(server.engine().status().counters.aborted, 1);
}

}  // namespace
