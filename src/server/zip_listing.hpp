// The member names of a zip archive, read from its central directory (no decompression):
// enough to check an upload (POST /sync_train_code) before storing it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace swarm {

/// Member names in central-directory order. Throws SwarmError(INVALID_ARGUMENT) when `bytes`
/// is not a readable zip archive (no end record, truncated or inconsistent directory, zip64).
std::vector<std::string> zip_member_names(std::string_view bytes);

/// AgentJet's rules for an uploaded code archive: not empty; every member `ajet` or under
/// `ajet/`; no absolute path, drive letter or `..` component; at least one member under
/// `ajet/`. Throws SwarmError(INVALID_ARGUMENT) with AgentJet's wording otherwise.
void check_agentjet_code_zip(std::string_view bytes);

}  // namespace swarm
