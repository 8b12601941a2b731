// Small, fully specified PRNGs for reproducible streams (std:: distributions are not
// reproducible across standard libraries). Not for secrets: keys use getrandom(2).
#pragma once

#include <cstdint>

namespace swarm {

/// SplitMix64 step: advances `state` and returns the next output.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// xoshiro256**, its four state words seeded by splitmix64 from `seed`.
/// Copyable (a copy continues the same stream); not thread-safe.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace swarm
