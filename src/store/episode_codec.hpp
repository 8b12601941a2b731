// A finished episode as bytes, and back: the record the episode store keeps (exact: every
// token id, log-prob and version round-trips bit for bit). No SQLite, no torch.
#pragma once

#include <string>
#include <string_view>

#include "rollout_pool/types.hpp"

namespace swarm {

/// Encodes everything a FinishedEpisode holds (format version 2, little-endian).
std::string encode_finished_episode(const FinishedEpisode& episode);

/// The inverse of encode_finished_episode; also reads version 1 (calls at temperature 1).
/// SwarmError(INTERNAL) naming what is wrong when `bytes` is truncated, has trailing bytes, an unknown version or inconsistent
/// lengths; never reads out of bounds.
FinishedEpisode decode_finished_episode(std::string_view bytes);

}  // namespace swarm
