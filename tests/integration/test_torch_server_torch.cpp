// The torch engine behind the real HTTP server, driven by the real client SDK: a small
// random-weight model with SmolLM2's real tokenizer and chat template (created once per run
// with init_random_model, like `swarm-model init`).
//
// The multi-turn test is the context tracker's contract on the real engine: the ids the
// server records are exactly the template's prompt ids and the sampled completion ids (no
// re-tokenization), and a conversation whose later prompts extend the earlier ones becomes
// one sample whose loss mask is 1 exactly on the sampled tokens.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "http/http_client.hpp"
#include "engine/torch_backend.hpp"
#include "model/model_tools.hpp"
#include "support/client_helpers.hpp"
#include "support/random_schema.hpp"
#include "support/test_server.hpp"
#include "swarm/swarm.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

using namespace swarm;
using namespace std::chrono_literals;
using json = nlohmann::json;
using swarm::testing::fast_client;
using swarm::testing::reward;
using swarm::testing::task;
using swarm::testing::TestServer;

namespace {

namespace fs = std::filesystem;

// A SmolLM2-tokenizer model small enough to run fast: hidden 64, 2 layers, GQA 4/2.
class TinyChatModel : public ::testing::Environment {
 public:
  static fs::path dir() { return root() / "model"; }
  static fs::path root() {
    return fs::temp_directory_path() / ("swarm-torch-server-" + std::to_string(::getpid()));
  }

  void SetUp() override {
    const fs::path src = fs::path(SWARM_FIXTURES_DIR) / "models" / "smollm2-135m-instruct-noweights";
    const fs::path cfg_dir = root() / "config";
    fs::remove_all(root());
    fs::create_directories(cfg_dir);
    for (const auto& entry : fs::directory_iterator(src))
      fs::copy_file(entry.path(), cfg_dir / entry.path().filename());
    json config = json::parse(std::ifstream(cfg_dir / "config.json"));
    config["hidden_size"] = 64;
    config["intermediate_size"] = 128;
    config["num_hidden_layers"] = 2;
    config["num_attention_heads"] = 4;
    config["num_key_value_heads"] = 2;
    config["max_position_embeddings"] = 1024;
    config.erase("head_dim");
    std::ofstream(cfg_dir / "config.json") << config.dump(2);
    InitModelOptions o;
    o.from = cfg_dir;
    o.out = dir();
    o.seed = 7;
    o.dtype = DType::F32;
    init_random_model(o);
  }
  void TearDown() override { fs::remove_all(root()); }
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new TinyChatModel);

Job tiny_job() {
  Job job;
  job.model = TinyChatModel::dir().string();
  job.batch_size = 1;
  job.num_repeat = 1;
  job.max_prompt_length = 512;
  job.max_response_length = 24;
  job.engine_threads = 2;
  return job;
}

std::unique_ptr<Backend> torch_backend() { return make_torch_backend(); }

std::vector<TokenId> ids_of(const json& a) { return a.get<std::vector<TokenId>>(); }

TEST(TorchServer, ThreeTurnConversationIsRecordedExactlyAndMergedIntoOneSample) {
  TestServer server(torch_backend);
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(tiny_job());
  OpenAIEndpoint ep = client.begin_episode(120, "train", 60s);
  OpenAIClient llm(ep);

  ChatParams params;
  params.temperature = 0.0;
  params.max_tokens = 6;
  params.logprobs = true;
  params.extra = {{"return_token_ids", true}};

  struct Turn {
    std::vector<TokenId> prompt, completion;
    std::vector<float> logprobs;
  };
  std::vector<Turn> turns;
  json messages = json::array({{{"role", "system"}, {"content", "You are a terse assistant."}}});
  const std::vector<std::string> user_says = {"Name a colour.", "Another one?", "And a third, please."};
  for (const auto& say : user_says) {
    messages.push_back({{"role", "user"}, {"content", say}});
    ChatResult r = llm.chat(messages, params);
    const json& choice = r.raw["choices"][0];
    Turn t;
    t.prompt = ids_of(r.raw["prompt_token_ids"]);
    t.completion = ids_of(choice["token_ids"]);
    for (const auto& lp : choice["logprobs"]["content"]) t.logprobs.push_back(lp["logprob"].get<float>());
    ASSERT_EQ(t.logprobs.size(), t.completion.size());
    EXPECT_EQ(r.usage.prompt_tokens, static_cast<int>(t.prompt.size()));
    EXPECT_EQ(r.usage.completion_tokens, static_cast<int>(t.completion.size()));
    turns.push_back(t);
    // The agent sends the assistant's reply back as text, as any OpenAI agent does.
    messages.push_back({{"role", "assistant"}, {"content", r.content}});
  }

  // The recorded prompt is exactly the template's rendering, tokenized once.
  auto tokenizer = Tokenizer::from_directory(TinyChatModel::dir().string());
  ChatTemplate tmpl = ChatTemplate::from_directory(TinyChatModel::dir().string());
  json first = json::array({messages[0], messages[1]});
  EXPECT_EQ(turns[0].prompt, tokenizer->encode(tmpl.render(first, nullptr, true), false));

  ASSERT_TRUE(client.end_episode(task("colours"), ep.episode_uuid, reward(0.5)));
  ASSERT_TRUE(server.engine().wait_for_step(1, 60s));
  auto batches = server.batches->copy();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].episodes.size(), 1u);
  const auto& samples = batches[0].episodes[0].samples;

  // Build the expected timelines from what the API returned, by the episode rule (docs/design.md).
  struct Timeline {
    std::vector<TokenId> ids;
    std::vector<uint8_t> mask;
    std::vector<float> logprobs;
    int calls = 0;
  };
  std::vector<Timeline> expected;
  for (const Turn& t : turns) {
    Timeline* into = nullptr;
    for (auto& tl : expected)
      if (t.prompt.size() >= tl.ids.size() && std::equal(tl.ids.begin(), tl.ids.end(), t.prompt.begin()) &&
          (!into || tl.ids.size() >= into->ids.size()))
        into = &tl;
    if (!into) into = &expected.emplace_back();
    for (size_t i = into->ids.size(); i < t.prompt.size(); ++i) {
      into->ids.push_back(t.prompt[i]);
      into->mask.push_back(0);
      into->logprobs.push_back(0.f);
    }
    for (size_t i = 0; i < t.completion.size(); ++i) {
      into->ids.push_back(t.completion[i]);
      into->mask.push_back(1);
      into->logprobs.push_back(t.logprobs[i]);
    }
    ++into->calls;
  }
  // With this model, seed and conversation, every later prompt extends the earlier timeline
  // (the reply's text re-renders to the sampled ids): one sample of three calls. If a change
  // in tokenizer/template/sampling breaks that, the comparison below still checks the split.
  EXPECT_EQ(expected.size(), 1u) << "the turns did not chain; expected one merged timeline";
  ASSERT_EQ(samples.size(), expected.size());
  for (size_t s = 0; s < samples.size(); ++s) {
    const Sample& got = samples[s];
    const Timeline& want = expected[s];
    ASSERT_EQ(got.token_ids.size(), want.ids.size());
    for (size_t i = 0; i < want.ids.size(); ++i) {
      ASSERT_EQ(got.token_ids[i], want.ids[i]) << "token " << i;
      ASSERT_EQ(got.loss_mask[i], want.mask[i]) << "mask at token " << i;
      EXPECT_NEAR(got.rollout_logprobs[i], want.logprobs[i], 1e-6) << "logprob at token " << i;
      EXPECT_EQ(got.policy_versions[i], want.mask[i] ? 0 : -1) << "policy version at token " << i;
    }
    EXPECT_EQ(got.num_calls, want.calls);
    EXPECT_EQ(got.task_id, "colours");
    EXPECT_DOUBLE_EQ(got.reward, 0.5);
  }
}

// The trainer recomputes each token's log-prob at the temperature its call sampled at: episodes
// of two chained turns (0.6, then 1.3: one sample of two calls) train with a log-prob mismatch
// at fp32 noise. Before, the trainer took log_softmax(logits) at every temperature: 0.1-0.3.
TEST(TorchServer, TokensSampledAtAnyTemperatureTrainAsSampled) {
  TestServer server(torch_backend);
  SwarmClient client(server.url(), fast_client());
  Job job = tiny_job();
  job.batch_size = 1;
  job.num_repeat = 3;
  job.temperature = 0.6;  // the first turn gives none: the job's
  job.ppo_epochs = 2;     // old log-probs recomputed by a pass of their own, then compared
  client.auto_sync_train_config_and_start_engine(job);
  for (int e = 0; e < 3; ++e) {
    OpenAIEndpoint ep = client.begin_episode(120, "train", 60s);
    OpenAIClient llm(ep);
    ChatParams first;
    first.max_tokens = 12;
    first.seed = 100 + e;
    json messages = json::array({{{"role", "user"}, {"content", "Name a colour."}}});
    ChatResult r1 = llm.chat(messages, first);
    messages.push_back({{"role", "assistant"}, {"content", r1.content}});
    messages.push_back({{"role", "user"}, {"content", "Another one?"}});
    ChatParams second = first;
    second.temperature = 1.3;
    llm.chat(messages, second);
    ASSERT_TRUE(client.end_episode(task("colours"), ep.episode_uuid, reward(0.5 * e)));
  }
  ASSERT_TRUE(server.engine().wait_for_step(1, 120s));
  const auto batches = server.batches->copy();
  ASSERT_EQ(batches.size(), 1u);
  std::set<float> temperatures;
  for (const auto& ep : batches[0].episodes)
    for (const Sample& s : ep.samples)
      for (const SampleCall& c : s.calls) temperatures.insert(c.temperature);
  EXPECT_EQ(temperatures, (std::set<float>{0.6f, 1.3f}));
  const auto reports = server.batches->copy_reports();
  ASSERT_EQ(reports.size(), 1u);
  const auto& m = reports[0].metrics;
  ASSERT_EQ(m.at("weights_updated"), 1);
  // fp32 on the CPU: the serving engine's and the trainer's forward passes differ in their last
  // bits only (~1e-7 at temperature 1); a missing or wrong temperature gives 1e-2 and more.
  EXPECT_LT(m.at("logprob_mismatch_mean"), 1e-5);
  EXPECT_LT(m.at("logprob_mismatch_max"), 1e-4);
  std::printf("temperatures 0.6 / 1.3: logprob_mismatch_mean %.3g, max %.3g\n", m.at("logprob_mismatch_mean"),
              m.at("logprob_mismatch_max"));
}

TEST(TorchServer, OpenAIRoutesServeTheModel) {
  TestServer server(torch_backend);
  SwarmClient client(server.url(), fast_client());
  client.auto_sync_train_config_and_start_engine(tiny_job());
  OpenAIEndpoint ep = client.begin_episode(120, "train", 60s);
  OpenAIClient llm(ep);
  EXPECT_EQ(llm.models(), std::vector<std::string>{TinyChatModel::dir().string()});

  ChatParams greedy;
  greedy.temperature = 0.0;
  greedy.max_tokens = 10;
  ChatResult plain = llm.chat({{"user", "Say something."}}, greedy);
  EXPECT_TRUE(plain.finish_reason == "stop" || plain.finish_reason == "length");
  EXPECT_GT(plain.usage.completion_tokens, 0);
  EXPECT_LE(plain.usage.completion_tokens, 10);
  EXPECT_EQ(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);

  // Streaming gives the same text (greedy) in pieces.
  std::string streamed;
  ChatResult s = llm.chat_stream(
      json::array({{{"role", "user"}, {"content", "Say something."}}}),
      [&](std::string_view d) { streamed += d; }, greedy);
  EXPECT_EQ(s.content, plain.content);
  EXPECT_EQ(streamed, plain.content);
  EXPECT_EQ(s.finish_reason, plain.finish_reason);

  // Same seed, same tokens; n > 1 gives n choices.
  ChatParams sampled;
  sampled.temperature = 1.0;
  sampled.max_tokens = 12;
  sampled.seed = 42;
  sampled.n = 3;
  sampled.extra = {{"return_token_ids", true}};
  ChatResult a = llm.chat({{"user", "Tell me a word."}}, sampled);
  ChatResult b = llm.chat({{"user", "Tell me a word."}}, sampled);
  ASSERT_EQ(a.raw["choices"].size(), 3u);
  for (size_t c = 0; c < 3; ++c)
    EXPECT_EQ(a.raw["choices"][c]["token_ids"], b.raw["choices"][c]["token_ids"]);

  // stop_token_ids: the greedy continuation cut at its third token, which is kept in the ids.
  ChatParams ids_params = greedy;
  ids_params.extra = {{"return_token_ids", true}};
  const json full_ids = llm.chat({{"user", "Say something."}}, ids_params).raw["choices"][0]["token_ids"];
  ASSERT_GE(full_ids.size(), 3u);
  size_t at = 2;
  while (at < full_ids.size() && std::find(full_ids.begin(), full_ids.begin() + static_cast<long>(at),
                                           full_ids[at]) != full_ids.begin() + static_cast<long>(at))
    ++at;
  if (at < full_ids.size()) {
    ChatParams stop_params = ids_params;
    stop_params.extra["stop_token_ids"] = json::array({full_ids[at]});
    ChatResult cut = llm.chat({{"user", "Say something."}}, stop_params);
    const json& cut_ids = cut.raw["choices"][0]["token_ids"];
    EXPECT_EQ(cut_ids.size(), at + 1);
    EXPECT_EQ(cut_ids.back(), full_ids[at]);
    EXPECT_EQ(cut.finish_reason, "stop");
  }
  ChatParams bad_ids = greedy;
  bad_ids.extra = {{"stop_token_ids", json::array({"x"})}};
  EXPECT_THROW(llm.chat({{"user", "hi"}}, bad_ids), ServerError);

  // Completions: a raw prompt, max_tokens respected.
  ChatResult comp = llm.complete("The weather today is", greedy);
  EXPECT_LE(comp.usage.completion_tokens, 10);

  // Bad parameters are OpenAI-style 400s and the server keeps serving.
  ChatParams bad;
  bad.temperature = -1.0;
  try {
    llm.chat({{"user", "hi"}}, bad);
    ADD_FAILURE() << "negative temperature accepted";
  } catch (const ServerError& e) {
    EXPECT_EQ(e.status(), 400);
  }
  try {
    llm.chat({{"user", std::string(4000, 'x') + " long"}}, greedy);
    ADD_FAILURE() << "over-long prompt accepted";
  } catch (const ServerError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("max_prompt_length"), std::string::npos) << e.what();
  }
  // A temperature that rounds to zero in fp32 (or would overflow logits / T) samples greedily:
  // before, it failed inside the engine step with a 500, for every generation in flight.
  ChatParams tiny = greedy;
  tiny.temperature = 1e-50;
  ChatParams ids_greedy = greedy;
  ids_greedy.extra = {{"return_token_ids", true}};
  tiny.extra = ids_greedy.extra;
  EXPECT_EQ(llm.chat({{"user", "Say something."}}, tiny).raw["choices"][0]["token_ids"],
            llm.chat({{"user", "Say something."}}, ids_greedy).raw["choices"][0]["token_ids"]);
  ChatResult after = llm.chat({{"user", "Still there?"}}, greedy);
  EXPECT_GT(after.usage.completion_tokens, 0);

  // The engine's live figures are in /metrics.
  HttpClient http(server.url());
  const std::string metrics = http.request("GET", "/metrics").body;
  EXPECT_NE(metrics.find("swarm_inference{field=\"decode_tokens_total\"}"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("swarm_inference{field=\"kv_blocks_free\"}"), std::string::npos);
  client.abort_episode(ep.episode_uuid);
}

// Structured outputs on the torch engine: a random-weights model sampling at
// temperature 1 under seeded random schemas. Every completion that finishes (not cut by
// max_tokens) must parse and validate (python3-jsonschema, independent of our grammar code);
// forced tool calls come back as calls of the right tool with arguments of its schema.
TEST(TorchServer, RandomModelFollowsSchemasAndForcedToolCalls) {
  TestServer server(torch_backend);
  SwarmClient client(server.url(), fast_client());
  Job job = tiny_job();
  job.max_response_length = 160;
  job.max_llm_calls_per_episode = 2000;  // one episode makes every request
  job.tool_call_parser = "hermes";       // SmolLM2's template has no tool format of its own
  client.auto_sync_train_config_and_start_engine(job);
  OpenAIEndpoint ep = client.begin_episode(600, "train", 60s);
  OpenAIClient llm(ep);
  std::mt19937_64 rng(11);
  const std::string path = (TinyChatModel::root() / "documents.jsonl").string();
  std::ofstream out(path);
  int finished = 0, cut = 0;
  // SWARM_STRUCTURED_SCHEMAS=1000 for the long run (docs/openai_api.md records one).
  const char* env = std::getenv("SWARM_STRUCTURED_SCHEMAS");
  const int kSchemas = env ? std::max(1, std::atoi(env)) : 120;
  for (int i = 0; i < kSchemas; ++i) {
    const nlohmann::ordered_json schema = swarm::testing::random_schema(rng, 2, false);
    ChatParams p;
    p.temperature = 1.0;
    p.seed = static_cast<uint64_t>(i);
    p.extra = {{"response_format",
                {{"type", "json_schema"},
                 {"json_schema", {{"name", "s"}, {"schema", json::parse(schema.dump())}}}}}};
    const ChatResult r = llm.chat({{"user", "Answer in JSON."}}, p);
    if (r.finish_reason == "length") {
      ++cut;
      continue;
    }
    ASSERT_EQ(r.finish_reason, "stop");
    ++finished;
    out << json{{"schema", json::parse(schema.dump())}, {"document", r.content}}.dump() << "\n";
  }
  out.close();
  std::printf("structured outputs: %d of %d random-model completions finished (%d cut by max_tokens)\n",
              finished, kSchemas, cut);
  EXPECT_GE(finished, kSchemas / 3);
  const auto [rc, output] = swarm::testing::validate_json_documents(path);
  if (rc != 77) {
    EXPECT_EQ(rc, 0) << output;
  }

  // tool_choice: required (any of two tools) and a named one.
  ChatParams tp;
  tp.temperature = 1.0;
  tp.max_tokens = 160;
  tp.tools =
      json::array({{{"type", "function"},
                    {"function",
                     {{"name", "add"},
                      {"parameters",
                       {{"type", "object"},
                        {"properties", {{"a", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}}}},
                        {"required", {"a"}},
                        {"additionalProperties", false}}}}}},
                   {{"type", "function"},
                    {"function",
                     {{"name", "flag"},
                      {"parameters",
                       {{"type", "object"},
                        {"properties", {{"on", {{"type", "boolean"}}}}},
                        {"required", {"on"}},
                        {"additionalProperties", false}}}}}}});
  tp.parallel_tool_calls = false;
  for (const json& choice :
       {json("required"), json{{"type", "function"}, {"function", {{"name", "flag"}}}}}) {
    tp.extra = {{"tool_choice", choice}};
    for (int seed = 0; seed < 3; ++seed) {
      tp.seed = static_cast<uint64_t>(seed);
      const ChatResult r = llm.chat({{"user", "Use a tool."}}, tp);
      if (r.finish_reason == "length") continue;
      ASSERT_EQ(r.finish_reason, "tool_calls") << r.content;
      ASSERT_EQ(r.tool_calls.size(), 1u);
      const json args = json::parse(r.tool_calls[0].arguments);
      if (choice.is_object()) {
        EXPECT_EQ(r.tool_calls[0].name, "flag");
      }
      if (r.tool_calls[0].name == "add") {
        EXPECT_TRUE(args["a"].is_number_integer() && args["a"] >= 0 && args["a"] <= 99);
      } else {
        EXPECT_TRUE(args["on"].is_boolean()) << r.tool_calls[0].arguments;
      }
    }
  }
}

TEST(TorchServer, ManyConcurrentEpisodesAllComplete) {
  TestServer server(torch_backend);
  SwarmClient admin(server.url(), fast_client());
  Job job = tiny_job();
  job.batch_size = 4;
  job.num_repeat = 4;
  admin.auto_sync_train_config_and_start_engine(job);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      try {
        SwarmClient c(server.url(), fast_client());
        OpenAIEndpoint ep = c.begin_episode(120, "train", 60s);
        ChatParams p;
        p.max_tokens = 16;
        ChatResult r = OpenAIClient(ep).chat({{"user", "Count to " + std::to_string(t)}}, p);
        if (r.usage.completion_tokens <= 0) ++errors;
        c.end_episode(task("t" + std::to_string(t / 4)), ep.episode_uuid, reward(double(t % 4)));
      } catch (const std::exception& e) {
        ++errors;
        ADD_FAILURE() << e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors, 0);
  ASSERT_TRUE(server.engine().wait_for_step(1, 60s));
  auto batches = server.batches->copy();
  ASSERT_FALSE(batches.empty());
  EXPECT_EQ(batches[0].num_tasks, 4);
}

}  // namespace
