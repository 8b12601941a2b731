// The experiment directory must be one filesystem for every rank: rank 0 names each checkpoint
// directory and every rank writes its optimizer shard into it. Checked at boot, not at the
// first checkpoint: rank 0 writes a probe file with a fresh token into the directory, every
// follower reads it back through the path rank 0 sent (docs/multi_node.md).
#pragma once

#include <filesystem>
#include <string>

namespace swarm {

struct SharedDirectoryProbe {
  std::string directory;  // absolute, as rank 0 sees it
  std::string file;       // the probe inside it
  std::string token;      // what the file holds
};

/// Creates `directory` if needed and writes a probe into it. Throws SwarmError(UNAVAILABLE)
/// when rank 0 cannot write there.
SharedDirectoryProbe write_shared_directory_probe(const std::filesystem::path& directory);
/// A follower's check. Throws SwarmError(INVALID_ARGUMENT) naming the rank, this machine, the
/// directory and what it found instead.
void check_shared_directory_probe(const SharedDirectoryProbe& probe, int rank);
/// Removes the probe file (errors ignored).
void remove_shared_directory_probe(const SharedDirectoryProbe& probe) noexcept;

}  // namespace swarm
