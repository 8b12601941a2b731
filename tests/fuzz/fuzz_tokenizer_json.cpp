// libFuzzer target: loading a tokenizer.json (src/text/tokenizer*.cpp), untrusted input from a
// model directory. Loading must end in a tokenizer or a SwarmError, never a crash or another
// exception; a tokenizer that loads must encode and decode a few strings without failing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "text/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<const swarm::Tokenizer> tok;
  try {
    tok = swarm::Tokenizer::from_json(json);
  } catch (const swarm::SwarmError&) {
    return 0;
  } catch (...) {
    std::abort();
  }
  try {
    for (const char* text : {"Hello world!", "  x\n\ty 123 \xc3\xa9\xe2\x82\xac", "<|im_start|>user"}) {
      const auto ids = tok->encode(text);
      (void)tok->decode(ids);
    }
  } catch (const swarm::SwarmError&) {
  } catch (...) {
    std::abort();
  }
  return 0;
}
