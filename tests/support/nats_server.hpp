// A real nats-server with JetStream on an ephemeral loopback port, its store in a temp dir
// (Debian's nats-server, installed by scripts/setup.sh). Can be killed and started again on the
// same port with the same store, as a broker that crashed and came back.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/scratch_dir.hpp"

extern char** environ;

namespace swarm::testing {

class NatsServer {
 public:
  NatsServer() { start(0); }
  ~NatsServer() { kill(); }
  NatsServer(const NatsServer&) = delete;
  NatsServer& operator=(const NatsServer&) = delete;

  /// Whether the nats-server binary is on PATH.
  static bool available() { return std::system("command -v nats-server >/dev/null 2>&1") == 0; }

  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

  /// SIGKILL: no clean shutdown, like a crash.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  /// Starts it again on the same port with the same store.
  void restart() {
    kill();
    start(port_);
  }

 private:
  void start(int port) {
    const std::filesystem::path dir = scratch_.path();
    const std::filesystem::path ports_dir = dir / "ports";
    std::filesystem::remove_all(ports_dir);
    std::filesystem::create_directories(ports_dir);
    std::vector<std::string> args = {"nats-server",
                                     "-js",
                                     "-sd",
                                     (dir / "store").string(),
                                     "-a",
                                     "127.0.0.1",
                                     "-p",
                                     port == 0 ? "-1" : std::to_string(port),
                                     "--ports_file_dir",
                                     ports_dir.string(),
                                     "-l",
                                     (dir / "nats.log").string()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid_, "nats-server", nullptr, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("cannot start nats-server (install it: scripts/setup.sh)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      for (const auto& f : std::filesystem::directory_iterator(ports_dir)) {
        std::ifstream in(f.path());
        std::stringstream ss;
        ss << in.rdbuf();
        const std::string text = ss.str();
        const auto colon = text.rfind(':');
        const auto end = text.find('"', colon);
        if (colon != std::string::npos && end != std::string::npos) {
          port_ = std::stoi(text.substr(colon + 1, end - colon - 1));
          return;
        }
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("nats-server exited at start (see " + (dir / "nats.log").string() + ")");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("nats-server did not write its ports file within 20 s");
  }

  ScratchDir scratch_{"nats"};
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace swarm::testing
