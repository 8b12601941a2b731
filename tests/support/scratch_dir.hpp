// Scratch directories, whole-file reads, and running a python3-torch reference script: what
// the parity tests and the checkpoint tests share.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace swarm::testing {

/// A fresh directory <tmp>/<prefix>-<pid>-<test name>, removed (with everything in it) when it
/// goes out of scope.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "-" + std::to_string(::getpid()) + "-" + (info ? info->name() : "x"));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// The whole file as bytes ("" when it cannot be read).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return std::move(out).str();
}

/// Runs `script` with Debian's /usr/bin/python3 (python3-torch), `request` as JSON on stdin,
/// and parses its stdout as JSON. Throws (failing the test) with the script's stderr when it
/// fails; request.json and reference.stderr are left in `scratch`. The reference runs without the
/// switches that make this machine behave as a lower CPU level (the cpu_level_* test variants):
/// it is the yardstick, not the code under test, and on a CPU with AVX512_BF16 libtorch's bf16
/// matmul fails under DNNL_MAX_CPU_ISA=AVX2 ("could not create a primitive descriptor iterator":
/// ATen asks oneDNN for bf16 because the CPU has it, and the capped oneDNN has no such kernel).
inline nlohmann::json run_python_reference(const std::filesystem::path& script, const nlohmann::json& request,
                                           const std::filesystem::path& scratch) {
  if (!std::filesystem::exists("/usr/bin/python3"))
    throw std::runtime_error("needs Debian's python3-torch at /usr/bin/python3");
  if (!std::filesystem::exists(script)) throw std::runtime_error("missing " + script.string());
  const auto req = scratch / "request.json", err = scratch / "reference.stderr";
  std::ofstream(req) << request.dump();
  const std::string cmd =
      "env -u DNNL_MAX_CPU_ISA -u ATEN_CPU_CAPABILITY -u SWARM_CPU_LEVEL /usr/bin/python3 '" +
      script.string() + "' < '" + req.string() + "' 2> '" + err.string() + "'";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int rc = ::pclose(pipe);
  if (rc != 0) throw std::runtime_error("reference failed (" + std::to_string(rc) + "): " + read_file(err));
  return nlohmann::json::parse(out);
}

}  // namespace swarm::testing
