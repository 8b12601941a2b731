// Who may call what: with an admin token the run's control routes answer 401 and
// change nothing without it; with a client token so do the episode routes; status stays open,
// the model endpoints keep their per-episode keys, and the SDK sends what it is given.
#include <gtest/gtest.h>

#include "support/client_helpers.hpp"
#include "support/http_helpers.hpp"
#include "support/scratch_dir.hpp"
#include "support/test_server.hpp"
#include "support/tls_cert.hpp"
#include "swarm/swarm.hpp"

using namespace swarm;
using namespace std::chrono_literals;
using swarm::testing::fast_client;
using swarm::testing::reward;
using swarm::testing::task;
using swarm::testing::TestServer;

namespace {

const std::string kAdmin = "admin-0123456789abcdef0123456789abcdef";
const std::string kClient = "client-0123456789abcdef0123456789abcdef";

Job small_job() {
  Job job;
  job.model = "mock-model";
  job.batch_size = 1;
  job.num_repeat = 2;
  return job;
}

int status_of(HttpClient& http, const std::string& method, const std::string& path, const std::string& body,
              const std::string& token) {
  std::vector<std::pair<std::string, std::string>> h;
  if (!token.empty()) h.push_back({"Authorization", "Bearer " + token});
  return http.request(method, path, body, h).status;
}

SwarmClientOptions with_tokens(const std::string& admin, const std::string& client) {
  SwarmClientOptions o = fast_client();
  o.admin_token = admin;
  o.client_token = client;
  return o;
}

TEST(AccessTokens, ControlRoutesNeedTheAdminTokenAndChangeNothingWithoutIt) {
  TestServer server(0.05, 1 << 20, AccessTokens{kAdmin, ""});
  HttpClient http(server.url());
  const std::string config = nlohmann::json{{"yaml_as_string", small_job().to_yaml()}}.dump();
  EXPECT_EQ(status_of(http, "POST", "/sync_train_config", config, ""), 401);
  EXPECT_EQ(status_of(http, "POST", "/sync_train_config", config, kAdmin + "x"), 401);
  EXPECT_EQ(status_of(http, "POST", "/sync_train_config", config, kClient), 401);
  EXPECT_FALSE(server.engine().status().config_synced) << "a refused sync changed the config";
  const HttpClientResponse r = http.request("POST", "/sync_train_config", config);
  EXPECT_NE(r.body.find("needs the admin token"), std::string::npos) << r.body;
  // Open: status, pool information, metrics, health.
  for (const char* path :
       {"/health", "/get_engine_status", "/get_current_batch_rollout_pool_information", "/metrics"})
    EXPECT_EQ(status_of(http, "GET", path, "", ""), 200) << path;
  // Other clients' data is the admin's.
  EXPECT_EQ(status_of(http, "GET", "/get_verbose_logs", "", ""), 401);
  EXPECT_EQ(status_of(http, "POST", "/replay_latest_llm_call", "", ""), 401);

  // An SDK without the token is refused; with it the run starts, and stop_engine needs it too.
  EXPECT_THROW(SwarmClient(server.url(), fast_client()).sync_train_config(small_job()), std::exception);
  SwarmClient admin(server.url(), with_tokens(kAdmin, ""));
  admin.auto_sync_train_config_and_start_engine(small_job());
  ASSERT_TRUE(server.engine().wait_for_state(EngineState::ROLLING, 10s));
  EXPECT_THROW(SwarmClient(server.url(), fast_client()).stop_engine(), std::exception);
  EXPECT_EQ(server.engine().status().state, EngineState::ROLLING) << "a refused stop_engine stopped the run";
  // Without a client token the episode routes stay open: an agent needs no token.
  SwarmClient agent(server.url(), fast_client());
  for (int k = 0; k < 2; ++k) {
    OpenAIEndpoint ep = agent.begin_episode(60, "train", 10s);
    OpenAIClient(ep).chat({{"user", "hi"}});
    agent.end_episode(task("t"), ep.episode_uuid, reward(k));
  }
  EXPECT_TRUE(server.engine().wait_for_step(1, 10s));
  admin.stop_engine();
  EXPECT_TRUE(server.engine().wait_for_state(EngineState::OFFLINE, 10s));
}

TEST(AccessTokens, EpisodeRoutesNeedTheClientTokenOrTheAdminToken) {
  TestServer server(0.05, 1 << 20, AccessTokens{kAdmin, kClient});
  SwarmClient admin(server.url(), with_tokens(kAdmin, ""));
  admin.auto_sync_train_config_and_start_engine(small_job());
  HttpClient http(server.url());
  const std::string claim = nlohmann::json{{"client_uuid", "c1"}, {"episode_type", "train"}}.dump();
  EXPECT_EQ(status_of(http, "POST", "/claim_episode", claim, ""), 401);
  EXPECT_EQ(status_of(http, "POST", "/claim_episode", claim, "nope"), 401);
  EXPECT_EQ(server.engine().pool_snapshot().running, 0) << "a refused claim took a slot";
  EXPECT_THROW(SwarmClient(server.url(), fast_client()).begin_episode(60, "train", 2s), std::exception);

  // The agent with the client token runs episodes; its model calls use the episode's own key.
  SwarmClient agent(server.url(), with_tokens("", kClient));
  for (int k = 0; k < 2; ++k) {
    OpenAIEndpoint ep = agent.begin_episode(60, "train", 10s);
    EXPECT_FALSE(OpenAIClient(ep).chat({{"user", "hi"}}).content.empty());
    EXPECT_TRUE(agent.can_continue_episode(ep.episode_uuid));
    agent.end_episode(task("t"), ep.episode_uuid, reward(k));
  }
  EXPECT_TRUE(server.engine().wait_for_step(1, 10s));
  // The client token is not the admin's.
  EXPECT_THROW(agent.stop_engine(), std::exception);
  EXPECT_NE(server.engine().status().state, EngineState::OFFLINE);
  // The admin token opens the episode routes too.
  EXPECT_EQ(status_of(http, "POST", "/claim_episode", claim, kAdmin), 200);
}

// With a client token, agents share it: so no open route may tell agent B the client_uuid of
// agent A's episodes (with it, B could end A's episode with a reward of its choosing). Open
// routes show client ids as a keyed hash; the admin sees them raw.
TEST(AccessTokens, AnAgentCannotLearnAnotherAgentsClientIdFromAnOpenRoute) {
  TestServer server(0.05, 1 << 20, AccessTokens{kAdmin, kClient});
  SwarmClient admin(server.url(), with_tokens(kAdmin, ""));
  Job job = small_job();
  job.batch_size = 4;  // no step: the episodes below stay in the pool's lists
  admin.auto_sync_train_config_and_start_engine(job);
  SwarmClientOptions a_options = with_tokens("", kClient);
  a_options.client_uuid = "agent-a-0000-secret-uuid";
  SwarmClient agent_a(server.url(), a_options);
  OpenAIEndpoint running = agent_a.begin_episode(60, "train", 10s);
  OpenAIEndpoint ended = agent_a.begin_episode(60, "train", 10s);
  OpenAIClient(ended).chat({{"user", "hi"}});
  WorkflowOutput turns = reward(1.0);
  turns.turn_rewards = {1.0};                                 // listed in turn_reward_episodes
  agent_a.end_episode(task("t"), ended.episode_uuid, turns);  // also lists A among the active clients

  HttpClient http(server.url());
  const std::vector<std::pair<std::string, std::string>> as_agent_b = {
      {"Authorization", "Bearer " + kClient}};
  for (const char* path : {"/get_current_batch_rollout_pool_information", "/get_engine_status", "/metrics",
                           "/health", "/get_server_experiment_dir"}) {
    for (const auto& headers : {std::vector<std::pair<std::string, std::string>>{}, as_agent_b}) {
      const HttpClientResponse r = http.request("GET", path, "", headers);
      EXPECT_EQ(r.status, 200) << path;
      EXPECT_EQ(r.body.find(a_options.client_uuid), std::string::npos)
          << path << " shows agent A's client_uuid";
    }
  }
  // The episode is listed, under a stable keyed id, and B cannot end it with that id.
  const auto info =
      nlohmann::json::parse(http.request("GET", "/get_current_batch_rollout_pool_information").body);
  std::string shown;
  for (const auto& e : info["running_episodes"])
    if (e["episode_uuid"] == running.episode_uuid) shown = e["client_uuid"];
  ASSERT_EQ(shown.rfind("client-", 0), 0u) << info.dump();
  EXPECT_EQ(info["running_episode_details"][running.episode_uuid]["client_uuid"], shown);
  const std::string end = nlohmann::json{
      {"client_uuid", shown},
      {"episode_uuid", running.episode_uuid},
      {"task_id", "t"},
      {"workflow_output",
       {{"reward", 1.0}}}}.dump();
  EXPECT_EQ(status_of(http, "POST", "/end_episode", end, kClient), 403);
  // The admin sees the raw id.
  const HttpClientResponse raw = http.request("GET", "/get_current_batch_rollout_pool_information", "",
                                              {{"Authorization", "Bearer " + kAdmin}});
  EXPECT_NE(raw.body.find(a_options.client_uuid), std::string::npos);
  agent_a.abort_episode(running.episode_uuid);
}

}  // namespace

namespace {

// TLS: a server with a certificate serves the whole protocol over HTTPS; the SDK
// verifies the certificate against the CA it is given, hands it on to the episode's OpenAI
// endpoint (an https:// URL), and refuses a server it cannot verify.
TEST(Tls, TheSdkRunsEpisodesOverHttpsAndVerifiesTheServer) {
  swarm::testing::ScratchDir dir("swarm-tls-sdk");
  const auto files =
      swarm::testing::make_self_signed(dir.path(), "server", "localhost", "DNS:localhost,IP:127.0.0.1");
  unsetenv("SWARM_CA_FILE");
  TestServer server(0.05, 1 << 20, AccessTokens{kAdmin, kClient}, files.cert, files.key);
  ASSERT_EQ(server.url().rfind("https://", 0), 0u);

  SwarmClientOptions unverified = with_tokens(kAdmin, kClient);
  try {
    SwarmClient(server.url(), unverified).get_engine_status();
    FAIL() << "the SDK accepted a certificate it cannot verify";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("not trusted"), std::string::npos) << e.what();
  }

  SwarmClientOptions o = with_tokens(kAdmin, kClient);
  o.ca_file = files.cert;
  SwarmClient client(server.url(), o);
  client.auto_sync_train_config_and_start_engine(small_job());
  ASSERT_TRUE(server.engine().wait_for_state(EngineState::ROLLING, 10s));
  for (int k = 0; k < 2; ++k) {
    OpenAIEndpoint ep = client.begin_episode(60, "train", 10s);
    EXPECT_EQ(ep.base_url.rfind("https://", 0), 0u) << ep.base_url;
    EXPECT_EQ(ep.ca_file, files.cert);
    const ChatResult r = OpenAIClient(ep).chat({{"user", "hi"}});
    EXPECT_FALSE(r.content.empty());
    client.end_episode(task("t"), ep.episode_uuid, reward(k));
  }
  EXPECT_TRUE(server.engine().wait_for_step(1, 10s));
  // Plain HTTP on the same port is refused with a reason; the run goes on.
  HttpClient plain("http://127.0.0.1:" + std::to_string(server.port()));
  const HttpClientResponse r = plain.request("GET", "/get_engine_status");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("https://"), std::string::npos) << r.body;
  EXPECT_EQ(client.get_engine_status().engine_status, "ENGINE.ROLLING");
  client.stop_engine();
  EXPECT_TRUE(server.engine().wait_for_state(EngineState::OFFLINE, 10s));
}

}  // namespace
