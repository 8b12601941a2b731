// A self-contained PNG encoder: 8-bit RGB, one zlib stream (fixed-Huffman deflate with
// greedy LZ77), CRC-32 and Adler-32 computed here. No libpng, no zlib.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "plot/image.hpp"

namespace swarm::plot {

/// CRC-32 (ISO 3309 / PNG, reflected polynomial 0xEDB88320). Pass the previous result as
/// `crc` to continue a running checksum; 0 starts a new one.
uint32_t crc32(std::span<const uint8_t> data, uint32_t crc = 0);

/// Adler-32 (RFC 1950). Pass the previous result as `adler` to continue; 1 starts a new one.
uint32_t adler32(std::span<const uint8_t> data, uint32_t adler = 1);

/// A zlib stream (RFC 1950) holding `data` as one fixed-Huffman deflate block (RFC 1951),
/// matches found by a greedy hash-chain LZ77 over the 32 KiB window.
std::vector<uint8_t> zlib_compress(std::span<const uint8_t> data);

/// The PNG file for `image`: signature, IHDR (8-bit truecolour, no interlace), one IDAT
/// (scanlines with filter type 0), IEND.
std::vector<uint8_t> encode_png(const RgbImage& image);

/// Writes encode_png(image) to `path` through a temporary file and a rename. Throws
/// SwarmError(INVALID_ARGUMENT) when the file cannot be written.
void write_png(const std::filesystem::path& path, const RgbImage& image);

}  // namespace swarm::plot
