// The main() of every unit and integration test binary: each test process runs in a scratch
// directory of its own. ctest runs the cases of one binary as separate processes side by side,
// and an in-process swarm-server writes its run files under ./experiments by default — a fresh
// start there moves the earlier run aside (engine/run_files.hpp), which must never be another
// running test's files. Child processes a test starts (ranks: /proc/self/exe) inherit the
// directory and keep it (SWARM_TEST_SCRATCH is set). The directory is removed when every test
// passed and kept, named on stderr, when one failed.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::filesystem::path scratch;
  if (std::getenv("SWARM_TEST_SCRATCH") == nullptr) {
    std::string pattern = (std::filesystem::temp_directory_path() / "swarm-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::cerr << "test main: cannot create a scratch directory under " << pattern << "\n";
      return 2;
    }
    scratch = pattern;
    ::setenv("SWARM_TEST_SCRATCH", scratch.c_str(), 1);
    std::filesystem::current_path(scratch);
  }
  const int rc = RUN_ALL_TESTS();
  if (!scratch.empty()) {
    std::error_code ec;
    std::filesystem::current_path(scratch.parent_path(), ec);
    if (rc == 0) {
      std::filesystem::remove_all(scratch, ec);
    } else {
      std::cerr << "test main: run files kept in " << scratch.string() << "\n";
    }
  }
  return rc;
}
