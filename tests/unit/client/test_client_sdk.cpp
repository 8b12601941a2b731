// Client SDK against a scripted fake server (swarm::HttpServer on an ephemeral port).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "client/sse_parser.hpp"
#include "http/http_transport.hpp"
#include "swarm/swarm.hpp"

namespace swarm {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

HttpResponse json_response(const json& body, int status = 200) {
  HttpResponse r;
  r.status = status;
  r.body = body.dump();
  return r;
}

HttpResponse error_response(int status, const std::string& type, const std::string& message) {
  return json_response(
      {{"error", {{"message", message}, {"type", type}, {"code", status}}}, {"success", false}}, status);
}

/// An HttpServer whose routes are scripted per test. Records every request.
class FakeServer {
 public:
  using Route = std::function<HttpResponse(const HttpRequest&)>;
  using StreamRoute = std::function<void(const HttpRequest&, ResponseSink&)>;

  FakeServer() {
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.io_threads = 2;
    server_ = std::make_unique<HttpServer>(o, [this](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
      handle(std::move(req), std::move(sink));
    });
    server_->start();
  }
  ~FakeServer() { server_->stop(200); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

  void on(const std::string& path, Route r) {
    std::lock_guard lock(mu_);
    routes_[path] = std::move(r);
  }
  void on_stream(const std::string& path, StreamRoute r) {
    std::lock_guard lock(mu_);
    stream_routes_[path] = std::move(r);
  }
  int count(const std::string& path) {
    std::lock_guard lock(mu_);
    int n = 0;
    for (const auto& r : requests_) n += r.path == path;
    return n;
  }
  std::vector<HttpRequest> requests(const std::string& path) {
    std::lock_guard lock(mu_);
    std::vector<HttpRequest> out;
    for (const auto& r : requests_)
      if (r.path == path) out.push_back(r);
    return out;
  }
  json last_body(const std::string& path) {
    auto rs = requests(path);
    return rs.empty() ? json() : json::parse(rs.back().body);
  }

 private:
  void handle(HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
    Route route;
    StreamRoute stream_route;
    {
      std::lock_guard lock(mu_);
      requests_.push_back(req);
      if (auto it = routes_.find(req.path); it != routes_.end()) route = it->second;
      if (auto it = stream_routes_.find(req.path); it != stream_routes_.end()) stream_route = it->second;
    }
    if (stream_route) return stream_route(req, *sink);
    sink->respond(route ? route(req) : error_response(404, "not_found_error", "no route " + req.path));
  }

  std::unique_ptr<HttpServer> server_;
  std::mutex mu_;
  std::map<std::string, Route> routes_;
  std::map<std::string, StreamRoute> stream_routes_;
  std::vector<HttpRequest> requests_;
};

SwarmClientOptions fast_options() {
  SwarmClientOptions o;
  o.backoff_initial = 2ms;
  o.backoff_max = 10ms;
  o.request_timeout = 2s;
  o.log_level = ClientLogLevel::OFF;
  return o;
}

json claim_ok(const std::string& uuid) {
  return {{"success", true},
          {"client_uuid", "c"},
          {"episode_uuid", uuid},
          {"openai_base_url", "http://127.0.0.1:1/v1"},
          {"openai_api_key", "sk-swarm-" + uuid},
          {"fail_cause", ""}};
}

Job small_job() {
  Job job;
  job.model = "mock-echo";
  job.batch_size = 2;
  job.num_repeat = 2;
  return job;
}

// A port nothing listens on: bind an ephemeral one, then close it.
uint16_t dead_port() {
  HttpServerOptions o;
  o.port = 0;
  HttpServer s(o, [](HttpRequest&&, std::shared_ptr<ResponseSink> sink) { sink->respond({}); });
  s.start();
  const uint16_t port = s.port();
  s.stop(0);
  return port;
}

// ------------------------------------------------------------------ begin_episode

TEST(SwarmClientTest, BeginEpisodeRetriesUntilGranted) {
  FakeServer server;
  std::atomic<int> calls{0};
  server.on("/claim_episode", [&](const HttpRequest&) {
    if (++calls < 3)
      return json_response({{"success", false}, {"fail_cause", "engine is ENGINE.ROLLING_POST"}});
    return json_response(claim_ok("ep-1"));
  });
  SwarmClient client(server.url(), fast_options());
  const OpenAIEndpoint ep = client.begin_episode(30, "eval");
  EXPECT_EQ(ep.episode_uuid, "ep-1");
  EXPECT_EQ(ep.api_key, "sk-swarm-ep-1");
  EXPECT_EQ(ep.base_url, "http://127.0.0.1:1/v1");
  EXPECT_EQ(calls.load(), 3);
  const json body = server.last_body("/claim_episode");
  EXPECT_EQ(body["client_uuid"], client.client_uuid());
  EXPECT_EQ(body["episode_type"], "eval");
  EXPECT_DOUBLE_EQ(body["discard_episode_timeout"].get<double>(), 30.0);
  EXPECT_TRUE(body.contains("throttle_policy"));
}

TEST(SwarmClientTest, BeginEpisodeRetries5xx) {
  FakeServer server;
  std::atomic<int> calls{0};
  server.on("/claim_episode", [&](const HttpRequest&) {
    if (++calls == 1) return error_response(503, "service_unavailable_error", "busy");
    return json_response(claim_ok("ep-2"));
  });
  SwarmClient client(server.url(), fast_options());
  EXPECT_EQ(client.begin_episode().episode_uuid, "ep-2");
  EXPECT_EQ(calls.load(), 2);
}

TEST(SwarmClientTest, BeginEpisodeDeadlineNamesLastCause) {
  FakeServer server;
  server.on("/claim_episode", [](const HttpRequest&) {
    return json_response({{"success", false}, {"fail_cause", "no free slot"}});
  });
  SwarmClient client(server.url(), fast_options());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    client.begin_episode(600, "train", 100ms);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("no free slot"), std::string::npos) << e.what();
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 100ms);
  EXPECT_LT(took, 2s);
  EXPECT_GE(server.count("/claim_episode"), 2);
}

TEST(SwarmClientTest, BeginEpisode4xxIsNotRetried) {
  FakeServer server;
  server.on("/claim_episode", [](const HttpRequest&) {
    return error_response(400, "invalid_request_error", "bad episode_type");
  });
  SwarmClient client(server.url(), fast_options());
  try {
    client.begin_episode(600, "bogus");
    FAIL() << "expected ServerError";
  } catch (const ServerError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.type(), "invalid_request_error");
    EXPECT_FALSE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("bad episode_type"), std::string::npos);
  }
  EXPECT_EQ(server.count("/claim_episode"), 1);
}

TEST(SwarmClientTest, NothingListeningIsTransportError) {
  const std::string url = "http://127.0.0.1:" + std::to_string(dead_port());
  SwarmClient client(url, fast_options());
  EXPECT_THROW(client.get_engine_status(), TransportError);
  EXPECT_THROW(client.stop_engine(), TransportError);
  EXPECT_FALSE(client.health());
  // begin_episode keeps retrying transport failures until its deadline.
  try {
    client.begin_episode(600, "train", 50ms);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    SUCCEED() << e.what();
  }
}

TEST(SwarmClientTest, MalformedUrlIsConfigError) {
  EXPECT_THROW(SwarmClient("localhost:10086"), ConfigError);
  EXPECT_THROW(OpenAIClient("not a url", "k"), ConfigError);
}

// ------------------------------------------------------------------ end / abort

TEST(SwarmClientTest, EndEpisodeSendsTaskAndOutput) {
  FakeServer server;
  server.on("/claim_episode", [](const HttpRequest&) { return json_response(claim_ok("ep-9")); });
  server.on("/end_episode", [](const HttpRequest&) { return json_response({{"success", true}}); });
  SwarmClient client(server.url(), fast_options());
  const auto ep = client.begin_episode();

  Task task;
  task.task_id = "t-1";
  task.main_query = "Repeat after me: apple";
  task.init_messages_json = R"([{"role":"system","content":"be brief"}])";
  task.env_type = "echo";
  task.metadata_json = R"({"difficulty":2})";
  WorkflowOutput out;
  out.reward = 0.5;
  out.metadata_json = R"({"note":"ok"})";
  out.log_metrics["turns"] = 3;
  EXPECT_TRUE(client.end_episode(task, ep.episode_uuid, out));

  const json body = server.last_body("/end_episode");
  EXPECT_EQ(body["client_uuid"], client.client_uuid());
  EXPECT_EQ(body["episode_uuid"], "ep-9");
  EXPECT_EQ(body["task_id"], "t-1");
  EXPECT_DOUBLE_EQ(body["workflow_output"]["reward"].get<double>(), 0.5);
  EXPECT_TRUE(body["workflow_output"]["is_success"].is_null());
  EXPECT_EQ(body["workflow_output"]["metadata"]["note"], "ok");
  EXPECT_DOUBLE_EQ(body["workflow_output"]["log_metrics"]["turns"].get<double>(), 3.0);
  EXPECT_EQ(body["task"]["main_query"], "Repeat after me: apple");
  EXPECT_EQ(body["task"]["init_messages"][0]["content"], "be brief");
  EXPECT_EQ(body["task"]["env_type"], "echo");
  EXPECT_EQ(body["task"]["metadata"]["difficulty"], 2);

  // Invalid JSON text is caught locally.
  task.metadata_json = "{not json";
  EXPECT_THROW(client.end_episode(task, "ep-9", out), ConfigError);

  // So is a reward JSON cannot carry (NaN would go out as null: an episode without reward).
  task.metadata_json = "{}";
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    out.reward = bad;
    EXPECT_THROW(client.end_episode(task, "ep-9", out), ConfigError);
  }
}

TEST(SwarmClientTest, LateEndEpisodeIsSentAsAbort) {
  FakeServer server;
  server.on("/claim_episode", [](const HttpRequest&) { return json_response(claim_ok("ep-late")); });
  server.on("/end_episode", [](const HttpRequest&) { return json_response({{"success", true}}); });
  server.on("/abort_episode", [](const HttpRequest&) { return json_response({{"success", true}}); });
  server.on("/can_continue_episode", [](const HttpRequest&) {
    return json_response({{"can_continue", true}});
  });
  auto fake_now = std::make_shared<std::atomic<int64_t>>(0);
  SwarmClientOptions o = fast_options();
  o.now = [fake_now] {
    return std::chrono::steady_clock::time_point(std::chrono::milliseconds(fake_now->load()));
  };
  SwarmClient client(server.url(), o);

  const auto ep = client.begin_episode(/*discard_episode_timeout=*/0.05);
  *fake_now += 90;                                             // < 2 × 50 ms: still alive
  EXPECT_TRUE(client.can_continue_episode(ep.episode_uuid));   // asks the server
  *fake_now += 30;                                             // 120 ms > 100 ms
  EXPECT_FALSE(client.can_continue_episode(ep.episode_uuid));  // decided locally
  EXPECT_EQ(server.count("/can_continue_episode"), 1);
  Task task;
  task.task_id = "t";
  WorkflowOutput out;
  out.reward = 1.0;
  EXPECT_FALSE(client.end_episode(task, ep.episode_uuid, out));
  EXPECT_EQ(server.count("/end_episode"), 0);
  ASSERT_EQ(server.count("/abort_episode"), 1);
  EXPECT_EQ(server.last_body("/abort_episode")["episode_uuid"], "ep-late");
}

TEST(SwarmClientTest, LateEndEpisodeWithRealClock) {
  FakeServer server;
  server.on("/claim_episode", [](const HttpRequest&) { return json_response(claim_ok("ep-real")); });
  server.on("/abort_episode",
            [](const HttpRequest&) { return error_response(404, "not_found_error", "gone"); });
  SwarmClient client(server.url(), fast_options());
  const auto ep = client.begin_episode(0.02);
  std::this_thread::sleep_for(60ms);
  // The abort's 404 (the server already reclaimed it) is only logged.
  EXPECT_FALSE(client.end_episode(Task{}, ep.episode_uuid, WorkflowOutput{}));
  EXPECT_EQ(server.count("/abort_episode"), 1);
  EXPECT_EQ(server.count("/end_episode"), 0);
}

TEST(SwarmClientTest, EndAbortAndContinueErrors) {
  FakeServer server;
  server.on("/end_episode",
            [](const HttpRequest&) { return error_response(404, "not_found_error", "unknown"); });
  server.on("/abort_episode",
            [](const HttpRequest&) { return error_response(403, "permission_error", "not yours"); });
  server.on("/can_continue_episode", [](const HttpRequest& r) {
    return json_response({{"can_continue", json::parse(r.body)["episode_uuid"] == "alive"}});
  });
  SwarmClient client(server.url(), fast_options());
  try {
    client.end_episode(Task{}, "x", WorkflowOutput{});
    FAIL();
  } catch (const ServerError& e) {
    EXPECT_EQ(e.status(), 404);
  }
  try {
    client.abort_episode("x");
    FAIL();
  } catch (const ServerError& e) {
    EXPECT_EQ(e.status(), 403);
    EXPECT_EQ(e.type(), "permission_error");
  }
  EXPECT_TRUE(client.can_continue_episode("alive"));
  EXPECT_FALSE(client.can_continue_episode("dead"));
}

// ------------------------------------------------------------------ run_episodes

/// Grants every claim with a fresh uuid and tracks which episodes are open.
struct EpisodeLedger {
  std::mutex mu;
  int next = 0;
  std::set<std::string> open;
  int ended = 0, aborted = 0;

  void install(FakeServer& server) {
    server.on("/claim_episode", [this](const HttpRequest&) {
      std::lock_guard lock(mu);
      const std::string id = "ep-" + std::to_string(next++);
      open.insert(id);
      return json_response(claim_ok(id));
    });
    server.on("/end_episode", [this](const HttpRequest& r) {
      std::lock_guard lock(mu);
      if (!open.erase(json::parse(r.body)["episode_uuid"].get<std::string>()))
        return error_response(404, "not_found_error", "unknown episode");
      ++ended;
      return json_response({{"success", true}});
    });
    server.on("/abort_episode", [this](const HttpRequest& r) {
      std::lock_guard lock(mu);
      if (!open.erase(json::parse(r.body)["episode_uuid"].get<std::string>()))
        return error_response(404, "not_found_error", "unknown episode");
      ++aborted;
      return json_response({{"success", true}});
    });
  }
};

std::vector<Task> make_tasks(int n) {
  std::vector<Task> tasks(n);
  for (int i = 0; i < n; ++i) tasks[i].task_id = "t" + std::to_string(i);
  return tasks;
}

TEST(SwarmClientTest, RunEpisodesAbortsAndRetriesFailures) {
  FakeServer server;
  EpisodeLedger ledger;
  ledger.install(server);
  SwarmClient client(server.url(), fast_options());
  std::atomic<bool> t1_failed_once{false};
  const auto tasks = make_tasks(6);
  const auto summary = client.run_episodes_until_all_complete(
      tasks,
      [&](const Task& task, const OpenAIEndpoint& ep) {
        EXPECT_FALSE(ep.api_key.empty());
        if (task.task_id == "t1" && !t1_failed_once.exchange(true)) throw std::runtime_error("flaky agent");
        WorkflowOutput out;
        out.reward = std::stod(task.task_id.substr(1));
        return out;
      },
      /*max_parallel=*/3);
  EXPECT_EQ(summary.completed, 6u);
  EXPECT_EQ(summary.failed, 0u);
  EXPECT_EQ(summary.retries, 1u);
  ASSERT_EQ(summary.rewards.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(summary.rewards[i].has_value());
    EXPECT_DOUBLE_EQ(*summary.rewards[i], i);
  }
  std::lock_guard lock(ledger.mu);
  EXPECT_EQ(ledger.ended, 6);
  EXPECT_EQ(ledger.aborted, 1);
  EXPECT_TRUE(ledger.open.empty()) << "a claimed episode leaked";
}

TEST(SwarmClientTest, RunEpisodesRetriesAreBounded) {
  FakeServer server;
  EpisodeLedger ledger;
  ledger.install(server);
  SwarmClient client(server.url(), fast_options());
  std::atomic<int> bad_calls{0};
  auto tasks = make_tasks(3);
  tasks[2].task_id = "bad";
  const auto summary = client.run_episodes_until_all_complete(
      tasks,
      [&](const Task& task, const OpenAIEndpoint&) -> WorkflowOutput {
        if (task.task_id == "bad") {
          ++bad_calls;
          throw 42;  // not even a std::exception
        }
        WorkflowOutput out;
        out.reward = 1.0;
        return out;
      },
      /*max_parallel=*/8, /*max_retries=*/2);
  EXPECT_EQ(summary.completed, 2u);
  EXPECT_EQ(summary.failed, 1u);
  EXPECT_EQ(summary.retries, 2u);
  EXPECT_EQ(bad_calls.load(), 3);
  EXPECT_FALSE(summary.rewards[2].has_value());
  EXPECT_TRUE(summary.rewards[0].has_value());
  std::lock_guard lock(ledger.mu);
  EXPECT_EQ(ledger.aborted, 3);
  EXPECT_EQ(ledger.ended, 2);
  EXPECT_TRUE(ledger.open.empty());
}

TEST(SwarmClientTest, RunEpisodesClaimDeadlineBoundsTheWait) {
  FakeServer server;
  server.on("/claim_episode", [](const HttpRequest&) {
    return json_response({{"success", false}, {"fail_cause", "no slot"}});
  });
  SwarmClientOptions o = fast_options();
  o.run_claim_deadline = 20ms;
  SwarmClient client(server.url(), o);
  std::atomic<int> calls{0};
  const auto summary = client.run_episodes_until_all_complete(
      make_tasks(2),
      [&](const Task&, const OpenAIEndpoint&) {
        ++calls;
        return WorkflowOutput{};
      },
      2, /*max_retries=*/1);
  EXPECT_EQ(summary.completed, 0u);
  EXPECT_EQ(summary.failed, 2u);
  EXPECT_EQ(summary.retries, 2u);
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(server.count("/abort_episode"), 0);  // nothing was claimed
}

TEST(SwarmClientTest, RunEpisodesRejectsBadArguments) {
  SwarmClient client("http://127.0.0.1:1", fast_options());
  auto fn = [](const Task&, const OpenAIEndpoint&) { return WorkflowOutput{}; };
  EXPECT_THROW(client.run_episodes_until_all_complete(make_tasks(1), fn, 0), ConfigError);
  EXPECT_THROW(client.run_episodes_until_all_complete(make_tasks(1), fn, 1, -1), ConfigError);
  const auto summary = client.run_episodes_until_all_complete({}, fn);
  EXPECT_EQ(summary.completed, 0u);
}

// ------------------------------------------------------------------ engine control

/// A scripted engine state machine behind the command routes.
struct ScriptedEngine {
  std::mutex mu;
  std::string state = "ENGINE.OFFLINE";
  std::string detail;
  int boot_polls = 2;  // status polls spent in BOOTING before the boot ends
  bool boot_fails = false;
  std::string synced_yaml;
  int polls_in_boot = 0;

  void install(FakeServer& server) {
    server.on("/get_engine_status", [this](const HttpRequest&) {
      std::lock_guard lock(mu);
      if (state == "ENGINE.BOOTING" && ++polls_in_boot > boot_polls) {
        state = boot_fails ? "ENGINE.OFFLINE" : "ENGINE.ROLLING";
        if (boot_fails) detail = "boot failed: model not found";
      }
      return json_response({{"engine_status", state},
                            {"engine_status_detail", detail},
                            {"global_step", 3},
                            {"policy_version", 3},
                            {"seconds_in_state", 0.0}});
    });
    server.on("/sync_train_config", [this](const HttpRequest& r) {
      std::lock_guard lock(mu);
      if (state != "ENGINE.OFFLINE") return error_response(409, "conflict_error", "engine is " + state);
      synced_yaml = json::parse(r.body)["yaml_as_string"].get<std::string>();
      return json_response({{"success", true}});
    });
    server.on("/start_engine", [this](const HttpRequest&) {
      std::lock_guard lock(mu);
      if (state != "ENGINE.OFFLINE" || synced_yaml.empty())
        return error_response(409, "conflict_error", "cannot start");
      state = "ENGINE.BOOTING";
      polls_in_boot = 0;
      detail.clear();
      return json_response({{"success", true}});
    });
    server.on("/stop_engine", [this](const HttpRequest&) {
      std::lock_guard lock(mu);
      state = "ENGINE.OFFLINE";
      return json_response({{"success", true}});
    });
  }
};

TEST(SwarmClientTest, AutoSyncFromOffline) {
  FakeServer server;
  ScriptedEngine engine;
  engine.install(server);
  SwarmClient client(server.url(), fast_options());
  const Job job = small_job();
  client.auto_sync_train_config_and_start_engine(job);
  EXPECT_EQ(server.count("/sync_train_config"), 1);
  EXPECT_EQ(server.count("/start_engine"), 1);
  std::lock_guard lock(engine.mu);
  EXPECT_EQ(engine.state, "ENGINE.ROLLING");
  const Job synced = Job::from_yaml(engine.synced_yaml);
  EXPECT_EQ(synced.model, "mock-echo");
  EXPECT_EQ(synced.batch_size, 2);
}

TEST(SwarmClientTest, AutoSyncWhenRollingDoesNothing) {
  FakeServer server;
  ScriptedEngine engine;
  engine.state = "ENGINE.WEIGHT_SYNCING";
  engine.install(server);
  SwarmClient client(server.url(), fast_options());
  client.auto_sync_train_config_and_start_engine(small_job());
  EXPECT_EQ(server.count("/sync_train_config"), 0);
  EXPECT_EQ(server.count("/start_engine"), 0);
  EXPECT_EQ(server.count("/stop_engine"), 0);
  EXPECT_EQ(server.count("/get_engine_status"), 1);
}

TEST(SwarmClientTest, AutoSyncWaitsWhileBooting) {
  FakeServer server;
  ScriptedEngine engine;
  engine.state = "ENGINE.BOOTING";
  engine.boot_polls = 3;
  engine.install(server);
  SwarmClient client(server.url(), fast_options());
  client.auto_sync_train_config_and_start_engine(small_job());
  EXPECT_EQ(server.count("/sync_train_config"), 0);
  EXPECT_EQ(server.count("/start_engine"), 0);
  EXPECT_GE(server.count("/get_engine_status"), 4);
}

TEST(SwarmClientTest, AutoSyncForceRestart) {
  FakeServer server;
  ScriptedEngine engine;
  engine.state = "ENGINE.ROLLING";
  engine.synced_yaml = "old";
  engine.install(server);
  SwarmClient client(server.url(), fast_options());
  client.auto_sync_train_config_and_start_engine(small_job(), /*force_restart=*/true);
  EXPECT_EQ(server.count("/stop_engine"), 1);
  EXPECT_EQ(server.count("/sync_train_config"), 1);
  EXPECT_EQ(server.count("/start_engine"), 1);
  std::lock_guard lock(engine.mu);
  EXPECT_EQ(engine.state, "ENGINE.ROLLING");
  EXPECT_NE(engine.synced_yaml, "old");
}

TEST(SwarmClientTest, AutoSyncBootFailureCarriesDetail) {
  FakeServer server;
  ScriptedEngine engine;
  engine.boot_fails = true;
  engine.install(server);
  SwarmClient client(server.url(), fast_options());
  try {
    client.auto_sync_train_config_and_start_engine(small_job());
    FAIL() << "expected ClientError";
  } catch (const ClientError& e) {
    EXPECT_NE(std::string(e.what()).find("model not found"), std::string::npos) << e.what();
  }
  EXPECT_EQ(server.count("/start_engine"), 1);
}

TEST(SwarmClientTest, AutoSyncTimeout) {
  FakeServer server;
  ScriptedEngine engine;
  engine.state = "ENGINE.BOOTING";
  engine.boot_polls = 1000000;
  engine.install(server);
  SwarmClient client(server.url(), fast_options());
  EXPECT_THROW(client.auto_sync_train_config_and_start_engine(small_job(), false, 80ms), TimeoutError);
}

TEST(SwarmClientTest, SyncValidatesLocally) {
  FakeServer server;
  ScriptedEngine engine;
  engine.install(server);
  SwarmClient client(server.url(), fast_options());
  Job job;  // no model
  try {
    client.sync_train_config(job);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model"), std::string::npos);
  }
  EXPECT_EQ(server.count("/sync_train_config"), 0);
  client.sync_train_config(small_job());
  client.start_engine();
  try {
    client.sync_train_config(small_job());  // not OFFLINE any more
    FAIL();
  } catch (const ServerError& e) {
    EXPECT_EQ(e.status(), 409);
  }
}

TEST(SwarmClientTest, StatusPoolAndHealth) {
  FakeServer server;
  server.on("/get_engine_status", [](const HttpRequest&) {
    return json_response({{"engine_status", "ENGINE.ROLLING"},
                          {"engine_status_detail", "ok"},
                          {"global_step", 7},
                          {"policy_version", 6},
                          {"seconds_in_state", 1.5}});
  });
  server.on("/get_current_batch_rollout_pool_information", [](const HttpRequest&) {
    return json_response({{"engine_status", "ENGINE.ROLLING"}, {"tasks", 3}});
  });
  server.on("/health", [](const HttpRequest&) {
    return json_response({{"status", "ok"}, {"engine_status", "ENGINE.ROLLING"}});
  });
  SwarmClient client(server.url() + "/", fast_options());
  const EngineStatus st = client.get_engine_status();
  EXPECT_EQ(st.engine_status, "ENGINE.ROLLING");
  EXPECT_EQ(st.engine_status_detail, "ok");
  EXPECT_EQ(st.global_step, 7);
  EXPECT_EQ(st.policy_version, 6);
  EXPECT_DOUBLE_EQ(st.seconds_in_state, 1.5);
  EXPECT_EQ(client.get_pool_information()["tasks"], 3);
  EXPECT_TRUE(client.health());
  server.on("/health", [](const HttpRequest&) { return error_response(500, "server_error", "boom"); });
  EXPECT_FALSE(client.health());
}

TEST(SwarmClientTest, ClientUuidIsRandomV4UnlessGiven) {
  SwarmClient a("http://127.0.0.1:1"), b("http://127.0.0.1:1");
  EXPECT_NE(a.client_uuid(), b.client_uuid());
  ASSERT_EQ(a.client_uuid().size(), 36u);
  EXPECT_EQ(a.client_uuid()[14], '4');
  SwarmClientOptions o;
  o.client_uuid = "mine";
  EXPECT_EQ(SwarmClient("http://127.0.0.1:1", o).client_uuid(), "mine");
}

TEST(SwarmClientTest, SharedByManyThreads) {
  FakeServer server;
  server.on("/can_continue_episode", [](const HttpRequest&) {
    return json_response({{"can_continue", true}});
  });
  SwarmClientOptions o = fast_options();
  o.max_connections = 2;  // more threads than connections: callers wait for one
  SwarmClient client(server.url(), o);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) ok += client.can_continue_episode("e");
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 120);
}

// ------------------------------------------------------------------ OpenAIClient

TEST(OpenAIClientTest, ChatSendsParamsAndParsesResponse) {
  FakeServer server;
  server.on("/v1/chat/completions", [](const HttpRequest& r) {
    if (r.header("authorization") != "Bearer sk-test")
      return error_response(401, "authentication_error", "bad key");
    return json_response(
        {{"id", "c1"},
         {"object", "chat.completion"},
         {"choices", json::array({{{"index", 0},
                                   {"message", {{"role", "assistant"}, {"content", "apple"}}},
                                   {"finish_reason", "stop"}}})},
         {"usage", {{"prompt_tokens", 5}, {"completion_tokens", 1}, {"total_tokens", 6}}}});
  });
  OpenAIClient llm(server.url() + "/v1", "sk-test");
  ChatParams p;
  p.temperature = 0.5;
  p.max_tokens = 8;
  p.stop = {"\n"};
  p.seed = 7;
  p.extra = {{"chat_template_kwargs", {{"enable_thinking", false}}}, {"model", "override"}};
  const std::vector<std::pair<std::string, std::string>> msgs = {{"system", "s"}, {"user", "Repeat: apple"}};
  const ChatResult r = llm.chat(msgs, p);
  EXPECT_EQ(r.content, "apple");
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.usage.prompt_tokens, 5);
  EXPECT_EQ(r.usage.completion_tokens, 1);
  EXPECT_EQ(r.usage.total_tokens, 6);
  EXPECT_EQ(r.raw["id"], "c1");

  const json body = server.last_body("/v1/chat/completions");
  EXPECT_EQ(body["messages"].size(), 2u);
  EXPECT_EQ(body["messages"][1]["content"], "Repeat: apple");
  EXPECT_DOUBLE_EQ(body["temperature"].get<double>(), 0.5);
  EXPECT_EQ(body["max_tokens"], 8);
  EXPECT_EQ(body["stop"][0], "\n");
  EXPECT_EQ(body["seed"], 7);
  EXPECT_EQ(body["model"], "override");
  EXPECT_EQ(body["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_FALSE(body.contains("top_p"));
  EXPECT_FALSE(body.contains("logprobs"));

  // The brace-list form builds the same messages.
  llm.chat({{"system", "s"}, {"user", std::string("Repeat: apple")}}, p);
  EXPECT_EQ(server.last_body("/v1/chat/completions")["messages"], body["messages"]);

  OpenAIClient wrong(server.url() + "/v1", "sk-wrong");
  try {
    wrong.chat(json::array({{{"role", "user"}, {"content", "x"}}}));
    FAIL();
  } catch (const ServerError& e) {
    EXPECT_EQ(e.status(), 401);
    EXPECT_EQ(e.type(), "authentication_error");
  }
}

TEST(OpenAIClientTest, CompleteAndModels) {
  FakeServer server;
  server.on("/v1/completions", [](const HttpRequest& r) {
    EXPECT_EQ(r.header("authorization"), "Bearer k");
    EXPECT_EQ(json::parse(r.body)["prompt"], "Once upon");
    return json_response({{"choices", json::array({{{"text", " a time"}, {"finish_reason", "length"}}})}});
  });
  server.on("/v1/models", [](const HttpRequest& r) {
    EXPECT_EQ(r.header("authorization"), "Bearer k");
    return json_response({{"object", "list"}, {"data", json::array({{{"id", "swarm"}}, {{"id", "other"}}})}});
  });
  OpenAIEndpoint ep{server.url() + "/v1", "k", "ep", ""};
  OpenAIClient llm(ep);
  const auto r = llm.complete("Once upon");
  EXPECT_EQ(r.content, " a time");
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(llm.models(), (std::vector<std::string>{"swarm", "other"}));
}

std::string sse_event(const json& chunk) { return "data: " + chunk.dump() + "\n\n"; }

json delta_chunk(const std::string& content, const json& finish = nullptr) {
  return {{"id", "s1"},
          {"object", "chat.completion.chunk"},
          {"model", "swarm"},
          {"choices",
           json::array({{{"index", 0}, {"delta", {{"content", content}}}, {"finish_reason", finish}}})}};
}

TEST(OpenAIClientTest, ChatStreamAssemblesDeltasSplitAcrossChunks) {
  std::string stream = ": keep-alive\n\n";
  stream += sse_event({{"id", "s1"},
                       {"object", "chat.completion.chunk"},
                       {"choices", json::array({{{"index", 0}, {"delta", {{"role", "assistant"}}}}})}});
  stream += sse_event(delta_chunk("Hel"));
  stream += sse_event(delta_chunk("lo, w\u00f6"));
  stream += sse_event(delta_chunk("rld"));
  stream += sse_event(delta_chunk("", "stop"));
  stream += sse_event({{"id", "s1"},
                       {"object", "chat.completion.chunk"},
                       {"choices", json::array()},
                       {"usage", {{"prompt_tokens", 4}, {"completion_tokens", 3}, {"total_tokens", 7}}}});
  stream += "data: [DONE]\n\n";

  FakeServer server;
  server.on_stream("/v1/chat/completions", [stream](const HttpRequest& r, ResponseSink& sink) {
    const json body = json::parse(r.body);
    if (!body.value("stream", false) || !body["stream_options"].value("include_usage", false)) {
      sink.respond(error_response(400, "invalid_request_error", "expected a stream request"));
      return;
    }
    sink.start_stream(200, "text/event-stream");
    for (size_t i = 0; i < stream.size(); i += 5) sink.write(stream.substr(i, 5));  // cut anywhere
    sink.end_stream();
  });
  OpenAIClient llm(server.url() + "/v1", "sk-s");
  std::vector<std::string> deltas;
  const ChatResult r = llm.chat_stream(json::array({{{"role", "user"}, {"content", "hi"}}}),
                                       [&](std::string_view d) { deltas.emplace_back(d); });
  EXPECT_EQ(r.content, "Hello, w\u00f6rld");
  EXPECT_EQ(deltas, (std::vector<std::string>{"Hel", "lo, w\u00f6", "rld"}));
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.usage.prompt_tokens, 4);
  EXPECT_EQ(r.usage.total_tokens, 7);
  EXPECT_EQ(r.raw["choices"][0]["message"]["content"], r.content);
  EXPECT_EQ(server.requests("/v1/chat/completions").back().header("authorization"), "Bearer sk-s");

  // The connection is still usable afterwards, and a callback exception propagates.
  EXPECT_THROW(llm.chat_stream(json::array({{{"role", "user"}, {"content", "hi"}}}),
                               [](std::string_view) { throw std::runtime_error("stop"); }),
               std::runtime_error);
}

TEST(OpenAIClientTest, ChatStreamErrorStatus) {
  FakeServer server;
  server.on("/v1/chat/completions", [](const HttpRequest&) {
    return error_response(400, "invalid_request_error", "prompt too long");
  });
  OpenAIClient llm(server.url() + "/v1", "k");
  try {
    llm.chat_stream(json::array(), nullptr);
    FAIL();
  } catch (const ServerError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("prompt too long"), std::string::npos);
  }
}

// ------------------------------------------------------------------ SSE parser

TEST(SseParserTest, EverySplitPointGivesTheSameEvents) {
  const std::string text =
      "data: one\n\n: comment\r\nevent: x\r\ndata: two\r\ndata:  three\r\n\r\ndata:four\rid: 1\r\rdata: "
      "[DONE]\n\n";
  const std::vector<std::string> expected = {"one", "two\n three", "four", "[DONE]"};
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); b += 3) {
      std::vector<std::string> events;
      SseParser p([&](const std::string& d) {
        events.push_back(d);
        return true;
      });
      p.feed(std::string_view(text).substr(0, a));
      p.feed(std::string_view(text).substr(a, b - a));
      p.feed(std::string_view(text).substr(b));
      p.finish();
      ASSERT_EQ(events, expected) << "split at " << a << "," << b;
    }
  }
}

TEST(SseParserTest, StopsWhenAsked) {
  int n = 0;
  SseParser p([&](const std::string&) { return ++n < 2; });
  EXPECT_FALSE(p.feed("data: a\n\ndata: b\n\ndata: c\n\n"));
  EXPECT_EQ(n, 2);
}

TEST(SseParserTest, FinishDispatchesUnterminatedEvent) {
  std::vector<std::string> events;
  SseParser p([&](const std::string& d) {
    events.push_back(d);
    return true;
  });
  p.feed("data: tail");
  EXPECT_TRUE(events.empty());
  p.finish();
  EXPECT_EQ(events, std::vector<std::string>{"tail"});
}

}  // namespace
}  // namespace swarm
