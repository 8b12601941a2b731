// libFuzzer target: the client SDK's SSE parser (src/client/sse_parser.cpp) on arbitrary bytes
// from a server. Whatever the bytes, it must not crash, and it must give the same events when
// the stream arrives in pieces cut anywhere (the first input byte chooses the cuts) as when it
// arrives whole.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "client/sse_parser.hpp"

namespace {

std::vector<std::string> parse(std::string_view bytes, size_t step) {
  std::vector<std::string> events;
  swarm::SseParser p([&](const std::string& data) {
    events.push_back(data);
    return events.size() < 10000;
  });
  bool go = true;
  for (size_t at = 0; at < bytes.size() && go; at += step) go = p.feed(bytes.substr(at, step));
  if (go) p.finish();
  return events;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 7;  // pieces of 1..7 bytes
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto whole = parse(bytes, bytes.size() + 1);
  const auto pieces = parse(bytes, step);
  if (whole != pieces) std::abort();  // cutting the stream changed what it says
  return 0;
}
