#include "common/random_id.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/error.hpp"

namespace swarm {

namespace {

// Keys must be unguessable, so they come from the kernel CSPRNG: one getrandom(2) call per
// buffer (no lock, no file descriptor), retried on EINTR / short reads.
void fill_random(uint8_t* out, size_t n) {
  size_t done = 0;
  while (done < n) {
    ssize_t got = getrandom(out + done, n - done, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw SwarmError(ErrorKind::INTERNAL, std::string("getrandom failed: ") + std::strerror(errno));
    }
    done += static_cast<size_t>(got);
  }
}

std::string to_hex(const uint8_t* data, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[data[i] >> 4]);
    s.push_back(kDigits[data[i] & 0xf]);
  }
  return s;
}

}  // namespace

std::string random_hex(size_t bytes) {
  std::vector<uint8_t> buf(bytes);
  fill_random(buf.data(), bytes);
  return to_hex(buf.data(), bytes);
}

std::string random_uuid() {
  uint8_t b[16];
  fill_random(b, sizeof b);
  b[6] = static_cast<uint8_t>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<uint8_t>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  const std::string h = to_hex(b, sizeof b);
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" +
         h.substr(20, 12);
}

}  // namespace swarm
