#include "dist/shared_directory.hpp"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <system_error>

#include "common/error.hpp"
#include "common/random_id.hpp"

namespace swarm {
namespace fs = std::filesystem;

SharedDirectoryProbe write_shared_directory_probe(const fs::path& directory) {
  std::error_code ec;
  const fs::path dir = fs::absolute(directory, ec).lexically_normal();
  fs::create_directories(dir, ec);
  SharedDirectoryProbe probe{dir.string(), "", random_hex(16)};
  probe.file = (dir / (".rank-probe-" + probe.token)).string();
  {
    std::ofstream out(probe.file, std::ios::trunc);
    out << probe.token;
    out.flush();
    SWARM_REQUIRE(out.good(), ErrorKind::UNAVAILABLE,
                  "rank 0 cannot write into the experiment directory " + probe.directory);
  }
  return probe;
}

void check_shared_directory_probe(const SharedDirectoryProbe& probe, int rank) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  const std::string who = "rank " + std::to_string(rank) + " (on " + (host[0] ? host : "this machine") + ")";
  const std::string why =
      ": every rank writes its optimizer shard into the checkpoints rank 0 makes there, so the experiment "
      "directory must be on a filesystem every node mounts at the same path (docs/multi_node.md)";
  std::ifstream in(probe.file);
  SWARM_REQUIRE(
      in.good(), ErrorKind::INVALID_ARGUMENT,
      who + " cannot see the experiment directory " + probe.directory +
          (fs::is_directory(probe.directory) ? " as rank 0 does (it exists here, without rank 0's files)"
                                             : " (it does not exist here)") +
          why);
  std::stringstream text;
  text << in.rdbuf();
  SWARM_REQUIRE(text.str() == probe.token, ErrorKind::INVALID_ARGUMENT,
                who + " sees another copy of the experiment directory " + probe.directory +
                    " than rank 0 (its probe holds other bytes)" + why);
}

void remove_shared_directory_probe(const SharedDirectoryProbe& probe) noexcept {
  std::error_code ec;
  fs::remove(probe.file, ec);
}

}  // namespace swarm
