// Unguessable identifiers (API keys, episode uuids, response and incident ids) from the kernel
// CSPRNG. Thread-safe.
#pragma once

#include <cstddef>
#include <string>

namespace swarm {

/// `bytes` random bytes, hex encoded (2 * bytes characters).
std::string random_hex(size_t bytes);
/// A random RFC 4122 version-4 UUID string.
std::string random_uuid();

}  // namespace swarm
