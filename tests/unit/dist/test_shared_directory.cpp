// The boot-time check that every rank sees rank 0's experiment directory (dist/shared_directory.hpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/error.hpp"
#include "dist/shared_directory.hpp"
#include "support/scratch_dir.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;

std::string refusal(const SharedDirectoryProbe& probe, int rank) {
  try {
    check_shared_directory_probe(probe, rank);
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

TEST(SharedDirectory, ARankThatSeesTheDirectoryPasses) {
  testing::ScratchDir scratch("swarm-shared-dir");
  const SharedDirectoryProbe probe = write_shared_directory_probe(scratch.path() / "exp" / "a" / "b");
  EXPECT_TRUE(fs::path(probe.directory).is_absolute());
  EXPECT_TRUE(fs::exists(probe.file));
  EXPECT_EQ(refusal(probe, 1), "");
  remove_shared_directory_probe(probe);
  EXPECT_FALSE(fs::exists(probe.file));
  // Two boots: two different tokens.
  EXPECT_NE(write_shared_directory_probe(probe.directory).token, probe.token);
}

TEST(SharedDirectory, ARankThatDoesNotIsToldWhyNamingItself) {
  testing::ScratchDir scratch("swarm-shared-dir");
  SharedDirectoryProbe probe = write_shared_directory_probe(scratch.path() / "exp");
  // Another machine where the directory is not mounted: it exists there empty, or not at all.
  remove_shared_directory_probe(probe);
  std::string why = refusal(probe, 3);
  EXPECT_NE(why.find("rank 3 (on "), std::string::npos) << why;
  EXPECT_NE(why.find("cannot see the experiment directory " + probe.directory), std::string::npos) << why;
  EXPECT_NE(why.find("without rank 0's files"), std::string::npos) << why;
  EXPECT_NE(why.find("docs/multi_node.md"), std::string::npos) << why;
  probe.directory = (scratch.path() / "elsewhere").string();
  probe.file = probe.directory + "/.rank-probe-x";
  EXPECT_NE(refusal(probe, 1).find("does not exist here"), std::string::npos);
  // A copy of the directory (same path, another filesystem with an old probe of that name).
  probe = write_shared_directory_probe(scratch.path() / "exp");
  std::ofstream(probe.file, std::ios::trunc) << "stale";
  EXPECT_NE(refusal(probe, 2).find("sees another copy"), std::string::npos);
}

}  // namespace
}  // namespace swarm
