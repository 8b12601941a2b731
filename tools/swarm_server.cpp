// swarm-server: the training server (OpenAI endpoint + command API + engine).
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "dist/dist_config.hpp"
#include "common/env.hpp"
#include "common/openmp_wait.hpp"
#include "common/random_id.hpp"
#include "dist/rank_channel.hpp"
#include "dist/rank_launcher.hpp"
#include "server/server.hpp"
#include "server/verbose_log.hpp"
#ifdef SWARM_WITH_TORCH
#include "engine/torch_backend.hpp"
#endif
#include "swarm/errors.hpp"
#include "swarm/job.hpp"

namespace {

// A follower rank of a multi-rank job: no HTTP; does what rank 0 says until it closes the job.
int run_follower(const swarm::DistConfig& dist) {
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [rank " + std::to_string(dist.rank) + "] %v");
#ifdef SWARM_WITH_TORCH
  try {
    return swarm::run_torch_follower(dist);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
#else
  spdlog::error(
      "RANK={} of WORLD_SIZE={}: multi-rank training needs the torch engine, and this build has no libtorch",
      dist.rank, dist.world_size);
  return 2;
#endif
}

// A token from --<kind>-token-file, else from the environment variable; "" when neither.
// Throws ConfigError on an unreadable or empty file.
std::string read_token(const std::string& file, const char* env, const char* what) {
  std::string token;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) throw swarm::ConfigError(std::string("cannot read the ") + what + " token file '" + file + "'");
    std::getline(in, token);
  } else if (const auto v = swarm::env_value(env)) {
    token = *v;
  }
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.front())))
    token.erase(token.begin());
  if (!file.empty() && token.empty())
    throw swarm::ConfigError(std::string("the ") + what + " token file '" + file + "' is empty");
  if (!token.empty() && token.size() < 16)
    spdlog::warn(
        "swarm-server: the {} token is {} characters; use 32 or more random ones (openssl rand -hex 32)",
        what, token.size());
  return token;
}

// `swarm-server start`: the flags that configure the server are bound straight into `server`;
// the rest is read here before the server exists (logging, ranks, token files).
struct StartFlags {
  swarm::SwarmServerOptions server;
  std::string log_level = "info";
  size_t max_body_mb = 8;  // server.http.max_body_bytes in MiB
  int nproc = 1;
  // Several machines (torchrun's names): this machine is node `node_rank` of `nnodes`, each
  // with `nproc` ranks; node 0's first rank serves HTTP.
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;
  int master_port = 0;
  std::string rendezvous_secret_file;
  std::string admin_token_file, client_token_file;
};

// The ranks of this process's job, from the flags over the environment (torchrun's variables).
// Returns an error text ("" when fine). Sets `launch` when this process starts its machine's
// other ranks itself (--nproc N > 1).
std::string plan_ranks(const StartFlags& flags, swarm::DistConfig& dist, bool& launch) {
  const bool multi_node_flags =
      flags.nnodes > 1 || flags.node_rank > 0 || !flags.master_addr.empty() || flags.master_port > 0;
  launch = false;
  if (!flags.rendezvous_secret_file.empty()) {
    std::ifstream in(flags.rendezvous_secret_file);
    if (!in) return "cannot read the rendezvous secret file '" + flags.rendezvous_secret_file + "'";
    std::getline(in, dist.secret);
    while (!dist.secret.empty() && std::isspace(static_cast<unsigned char>(dist.secret.back())))
      dist.secret.pop_back();
    if (dist.secret.empty())
      return "the rendezvous secret file '" + flags.rendezvous_secret_file + "' is empty";
  }
  if (multi_node_flags || flags.nproc > 1) {
    if (dist.world_size > 1)
      return "--nproc / --nnodes start and place the ranks themselves; do not also set WORLD_SIZE (=" +
             std::to_string(dist.world_size) + ")";
    if (flags.node_rank >= flags.nnodes)
      return "--node-rank " + std::to_string(flags.node_rank) + " is not below --nnodes " +
             std::to_string(flags.nnodes);
    dist.world_size = flags.nnodes * flags.nproc;
    dist.local_world_size = flags.nproc;
    dist.rank = flags.node_rank * flags.nproc;
    dist.local_rank = 0;
    launch = flags.nproc > 1;
    if (flags.nnodes > 1) {
      if (flags.master_addr.empty() || flags.master_port <= 0)
        return "--nnodes " + std::to_string(flags.nnodes) +
               " needs --master-addr and --master-port: node 0's address, which every node can reach";
      dist.master_addr = flags.master_addr;
      dist.master_port = flags.master_port;
    } else {  // one machine: loopback, and a port of our own unless one is given
      dist.master_addr = flags.master_addr.empty() ? "127.0.0.1" : flags.master_addr;
      dist.master_port = flags.master_port > 0 ? flags.master_port : swarm::pick_free_port(dist.master_addr);
      // The job's own secret: only its ranks (started here, told it) can join.
      if (dist.secret.empty()) dist.secret = swarm::random_hex(32);
    }
  }
  // Ranks on other machines must prove a secret set up beforehand.
  if (dist.world_size > dist.local_world_size && dist.secret.empty())
    return "ranks on several machines need a shared rendezvous secret: --rendezvous-secret-file FILE (the "
           "same "
           "file content on every node; openssl rand -hex 32 > FILE) or SWARM_RENDEZVOUS_SECRET";
  return "";
}

int run_start(StartFlags flags, const std::vector<std::string>& argv) {
  const std::string& log_level = flags.log_level;
  const std::string& engine = flags.server.engine.backend;
  auto level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off") {
    std::cerr << "swarm-server: unknown --log-level '" << log_level
              << "' (use trace, debug, info, warn, error, critical, off)\n";
    return 2;
  }
  spdlog::set_level(level);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  swarm::install_verbose_log_sink();  // before any thread logs (the ranks, the engine)

  swarm::DistConfig dist;
  bool launch = false;
  try {
    dist = swarm::DistConfig::from_env();
    // A rank started with RANK > 0 in its environment (by --nproc, torchrun, Slurm): a follower.
    if (dist.rank > 0) return run_follower(dist);
    if (const std::string problem = plan_ranks(flags, dist, launch); !problem.empty()) {
      spdlog::error("swarm-server: {}", problem);
      return 2;
    }
  } catch (const std::exception& e) {
    spdlog::error("swarm-server: {}", e.what());
    return 2;
  }
  if (dist.world_size > 1 && engine != "torch") {
    spdlog::error("swarm-server: several ranks (--nproc / --nnodes / WORLD_SIZE) need --engine torch");
    return 2;
  }
  // --nproc N: this process is the first rank of its machine; it starts the machine's others
  // (told rank 0's address and the job's secret).
  std::optional<swarm::LocalRanks> local_ranks;
  if (launch) {
    try {
      local_ranks.emplace(dist, argv);
    } catch (const std::exception& e) {
      spdlog::error("swarm-server: {}", e.what());
      return 1;
    }
  }
  if (dist.rank > 0) return run_follower(dist);  // another machine's first rank: no HTTP
#ifdef SWARM_WITH_TORCH
  if (engine == "torch") spdlog::info("swarm-server: {}", swarm::compute_paths_summary());
#endif
  std::shared_ptr<swarm::RankLeader> followers;
  if (dist.world_size > 1) {
    spdlog::info("swarm-server: rank 0 of {}: waiting for the other ranks on {}:{}", dist.world_size,
                 dist.master_addr, dist.master_port);
    try {
      followers = swarm::RankLeader::accept(dist.master_addr, dist.master_port, dist.world_size, dist.timeout,
                                            dist.secret);
    } catch (const std::exception& e) {
      const std::string gone = local_ranks ? local_ranks->exited() : std::string();
      spdlog::error("swarm-server: {}{}{}", e.what(), gone.empty() ? "" : "; ", gone);
      return 1;
    }
    spdlog::info("swarm-server: all {} ranks joined", dist.world_size);
  }

  // Block the stop signals in every thread; one thread waits for them (no work in a handler).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  swarm::SwarmServerOptions& options = flags.server;
  options.http.max_body_bytes = flags.max_body_mb * 1024 * 1024;
#ifdef SWARM_WITH_TORCH
  if (followers)
    swarm::register_torch_backend(followers, dist);
  else
    swarm::register_torch_backend();
#endif
  const auto engines = swarm::available_backends();
  if (std::find(engines.begin(), engines.end(), engine) == engines.end()) {
    std::string names;
    for (const auto& n : engines) names += (names.empty() ? "" : ", ") + n;
    std::cerr << "swarm-server: engine '" << engine
              << "' is not available in this build (available: " << names << ")\n";
    return 2;
  }
  try {
    options.tokens.admin = read_token(flags.admin_token_file, "SWARM_ADMIN_TOKEN", "admin");
    options.tokens.client = read_token(flags.client_token_file, "SWARM_CLIENT_TOKEN", "client");
  } catch (const swarm::ConfigError& e) {
    spdlog::error("swarm-server: {}", e.what());
    return 2;
  }
  int rc = 0;
  try {
    swarm::SwarmServer server(options);
    server.start();
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("swarm-server: received {}, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server.stop();
  } catch (const swarm::ConfigError& e) {
    spdlog::error("{}", e.what());
    rc = 2;
  } catch (const std::exception& e) {
    spdlog::error("swarm-server: {}", e.what());
    rc = 1;
  }
  // Closing the control channel ends the other ranks; then reap them.
  if (followers) followers->close();
  if (local_ranks) local_ranks->wait_all(std::chrono::seconds(30));
  if (rc == 0) spdlog::info("swarm-server: stopped");
  return rc;
}

std::string config_reference_markdown() {
  std::string out =
      "# Configuration reference\n\n"
      "A job is YAML with flat keys, synced by a client (`sync_train_config`, or `Job` in the SDK)\n"
      "or loaded with `swarm-server start --config FILE`. Unknown keys are an error; every error\n"
      "names the key. Only `model` is required. The smallest valid config:\n\n"
      "```yaml\nalgorithm: grpo\nmodel: /path/to/hf/model\nbatch_size: 32\nnum_repeat: 4\n```\n\n"
      "AgentJet's own nested config (what `AgentJetJob` sends: an `ajet:` tree beside verl's\n"
      "sections) is accepted too and mapped onto these keys; the mapping is in\n"
      "[agentjet.md](agentjet.md).\n\n"
      "This page is generated by `swarm-server config-reference`.\n\n"
      "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& f : swarm::Job::fields()) {
    // Only `model` has no default; other keys whose default is empty show it as "".
    std::string def = f.key == "model"
                          ? "(required)"
                          : "`" + (f.default_value.empty() ? std::string("\"\"") : f.default_value) + "`";
    out += "| `" + f.key + "` | " + f.type + " | " + def + " | " + f.doc + " |\n";
  }
  out +=
      "\n## Environment\n\n"
      "Every environment variable swarm's programs read (src/common/env.cpp holds this table and\n"
      "the one function that reads them). Flags and the job win where both exist.\n\n";
  out += swarm::env_reference_markdown();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // First, before any thread or file: it may re-execute this program. Only the torch engine runs
  // OpenMP work, so the mock engine and the other subcommands skip the second start (~0.6 s).
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--engine=torch" || (a == "--engine" && i + 1 < argc && std::string(argv[i + 1]) == "torch")) {
      swarm::bound_openmp_spin_wait(argv);
      break;
    }
  }
  CLI::App app{"swarm-server: RL post-training server (OpenAI-compatible endpoint + swarm command API)"};
  app.require_subcommand(1);
  StartFlags flags;
  swarm::HttpServerOptions& http = flags.server.http;
  auto* start = app.add_subcommand("start", "Start the server (engine OFFLINE until a client starts it)");
  start->add_option("--host", http.host, "Address to listen on")->capture_default_str();
  start->add_option("--port", http.port, "Port to listen on (0 = any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  start->add_option("--engine", flags.server.engine.backend, "Backend: mock (no model, for tests) or torch")
      ->capture_default_str()
      ->check(CLI::IsMember({"mock", "torch"}));
  start
      ->add_option("--config", flags.server.config_path,
                   "YAML job config to sync at start (see docs/configuration.md)")
      ->check(CLI::ExistingFile);
  start->add_option("--log-level", flags.log_level, "trace, debug, info, warn, error, critical, off")
      ->capture_default_str();
  start->add_option("--io-threads", http.io_threads, "HTTP I/O threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  start->add_option("--max-body-mb", flags.max_body_mb, "Largest request body in MiB (larger get 413)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  start
      ->add_option("--resume", flags.server.engine.resume_from,
                   "Continue a run from a checkpoint: a checkpoint directory (step-N), or a checkpoints/ or "
                   "experiment directory (its latest checkpoint). Weights, optimizer, step and counters are "
                   "restored at the first start_engine.")
      ->check(CLI::ExistingDirectory);
  start
      ->add_option("--nproc", flags.nproc,
                   "Training ranks on this machine (torch engine): rank 0 serves HTTP, every rank trains a "
                   "share of each batch with sharded optimizer state (Gloo on CPU, NCCL on GPUs). With "
                   "--nnodes, the ranks of each machine.")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  start
      ->add_option("--nnodes", flags.nnodes,
                   "Machines in the job (torchrun's name): start one swarm-server per machine with the same "
                   "--nnodes, --nproc, --master-addr, --master-port and rendezvous secret, and its own "
                   "--node-rank; node 0 serves HTTP. WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, "
                   "MASTER_ADDR, MASTER_PORT set per rank (Slurm, Kubernetes) work instead of the flags.")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  start->add_option("--node-rank", flags.node_rank, "This machine's index in [0, --nnodes)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4095));
  start->add_option("--master-addr", flags.master_addr,
                    "Node 0's address every node reaches (the ranks' control channel listens there)");
  start->add_option("--master-port", flags.master_port, "The control channel's port on --master-addr")
      ->check(CLI::Range(1, 65535));
  start
      ->add_option(
          "--rendezvous-secret-file", flags.rendezvous_secret_file,
          "File holding the job's rendezvous secret (else $SWARM_RENDEZVOUS_SECRET): every rank proves "
          "it when it joins, so no stranger or other job joins. Required across machines; one machine "
          "makes its own.")
      ->check(CLI::ExistingFile);
  start
      ->add_option("--admin-token-file", flags.admin_token_file,
                   "File holding the admin token (else $SWARM_ADMIN_TOKEN): sync_train_config, start_engine, "
                   "stop_engine, sync_train_code and the routes showing other clients' data then need "
                   "'Authorization: Bearer <token>'. Off by default.")
      ->check(CLI::ExistingFile);
  start
      ->add_option(
          "--client-token-file", flags.client_token_file,
          "File holding the client token (else $SWARM_CLIENT_TOKEN): the episode routes (claim, end, "
          "abort, can_continue, agree_sync_weight) then need it (or the admin token). Off by default.")
      ->check(CLI::ExistingFile);
  start
      ->add_option(
          "--max-connections", http.max_connections,
          "Open connections at most; more are answered 503 and closed (the open-file limit is raised to "
          "fit)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  start
      ->add_option(
          "--header-timeout", http.header_timeout_seconds,
          "Seconds a request may take from its first byte to the end of its headers, and a new connection "
          "to send its first byte (slow clients are cut; bodies and idle keep-alive have 60 s)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  auto* tls_cert_opt =
      start
          ->add_option("--tls-cert", http.tls_cert_file,
                       "PEM certificate chain: the server then speaks HTTPS only (TLS 1.2+), and "
                       "claimed episodes get https:// endpoints. Needs --tls-key. Off by default.")
          ->check(CLI::ExistingFile);
  auto* tls_key_opt =
      start->add_option("--tls-key", http.tls_key_file, "PEM private key (unencrypted) of --tls-cert")
          ->check(CLI::ExistingFile);
  tls_cert_opt->needs(tls_key_opt);
  tls_key_opt->needs(tls_cert_opt);
  auto* reference = app.add_subcommand("config-reference", "Print the configuration reference (Markdown)");
  auto* defaults = app.add_subcommand("default-config", "Print a YAML config with every key at its default");
  CLI11_PARSE(app, argc, argv);
  if (*start) return run_start(std::move(flags), std::vector<std::string>(argv, argv + argc));
  if (*reference) {
    std::cout << config_reference_markdown();
    return 0;
  }
  if (*defaults) {
    swarm::Job job;
    job.model = "/path/to/hf/model";
    std::cout << job.to_yaml();
    return 0;
  }
  return 0;
}
