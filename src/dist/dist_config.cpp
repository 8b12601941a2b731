#include "dist/dist_config.hpp"
#include "common/env.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "common/error.hpp"

namespace swarm {
namespace {

long env_int(const char* name, const std::string& value, long lo, long hi) {
  long out = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, out);
  SWARM_REQUIRE(ec == std::errc() && ptr == end && out >= lo && out <= hi, ErrorKind::INVALID_ARGUMENT,
                std::string(name) + "='" + value + "' is not an integer in [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + "]");
  return out;
}

}  // namespace

DistConfig DistConfig::from_env() {
  DistConfig config;
  const auto world_size = env_value("WORLD_SIZE");
  const auto rank = env_value("RANK");
  if (world_size) {
    config.world_size = static_cast<int>(env_int("WORLD_SIZE", *world_size, 1, 1 << 20));
    SWARM_REQUIRE(rank || config.world_size == 1, ErrorKind::INVALID_ARGUMENT,
                  "RANK is not set but WORLD_SIZE=" + *world_size);
  }
  if (rank) config.rank = static_cast<int>(env_int("RANK", *rank, 0, config.world_size - 1));
  config.local_world_size = config.world_size;
  if (const auto local = env_value("LOCAL_WORLD_SIZE"))
    config.local_world_size = static_cast<int>(env_int("LOCAL_WORLD_SIZE", *local, 1, config.world_size));
  config.local_rank = config.rank % config.local_world_size;
  if (const auto local = env_value("LOCAL_RANK"))
    config.local_rank = static_cast<int>(env_int("LOCAL_RANK", *local, 0, config.local_world_size - 1));
  if (const auto secret = env_value("SWARM_RENDEZVOUS_SECRET")) config.secret = *secret;
  if (const auto addr = env_value("MASTER_ADDR")) config.master_addr = *addr;
  if (const auto port = env_value("MASTER_PORT"))
    config.master_port = static_cast<int>(env_int("MASTER_PORT", *port, 1, 65535));
  if (const auto timeout = env_value("SWARM_DIST_TIMEOUT_SECONDS")) {
    double seconds = 0;
    const char* end = timeout->data() + timeout->size();
    const auto [ptr, ec] = std::from_chars(timeout->data(), end, seconds);
    SWARM_REQUIRE(ec == std::errc() && ptr == end && std::isfinite(seconds) && seconds > 0 && seconds < 1e7,
                  ErrorKind::INVALID_ARGUMENT,
                  "SWARM_DIST_TIMEOUT_SECONDS='" + *timeout + "' is not a positive number of seconds");
    config.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
  }
  return config;
}

}  // namespace swarm
