// libFuzzer target: the safetensors header parser on arbitrary bytes taken as a whole file.
// Any exception other than SwarmError, any sanitizer report, and any accepted header that
// breaks the parser's promises (tensors inside the buffer, tiling the data section, sizes
// consistent with dtype and shape) is a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "common/error.hpp"
#include "model/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = std::as_bytes(std::span<const uint8_t>(data, size));
  swarm::SafetensorsHeader header;
  try {
    header = swarm::parse_safetensors_header(bytes, size, "fuzz");
  } catch (const swarm::SwarmError&) {
    return 0;  // rejected with a clear error: fine
  }
  if (header.data_offset() > size) std::abort();
  const uint64_t data_size = size - header.data_offset();
  uint64_t covered = 0;
  volatile uint8_t sink = 0;
  for (const auto& t : header.tensors) {
    if (t.begin > t.end || t.end > data_size) std::abort();
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) std::abort();
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * swarm::dtype_size(t.dtype) != t.end - t.begin) std::abort();
    covered += t.end - t.begin;
    if (t.end > t.begin) {  // touch both ends: AddressSanitizer checks the bounds
      sink = sink + data[header.data_offset() + t.begin];
      sink = sink + data[header.data_offset() + t.end - 1];
    }
  }
  if (covered != data_size) std::abort();  // tiles the data section exactly
  return 0;
}
