// PNG output through libpng: 8-bit truecolour RGB, no interlace; compression left at libpng's
// defaults (zlib level 6, each row's filter picked by libpng's heuristic).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <vector>

#include "plot/image.hpp"

namespace swarm::plot {

/// Receives consecutive pieces of a PNG file as libpng produces them.
using PngSink = std::function<void(std::span<const uint8_t>)>;

/// Streams the PNG file for `image` to `sink`. An exception thrown by `sink` stops the encoding
/// and is rethrown here unchanged; an error reported by libpng throws SwarmError(INTERNAL).
/// libpng's warnings are not printed.
void encode_png(const RgbImage& image, const PngSink& sink);

/// The PNG file for `image`, in memory.
std::vector<uint8_t> encode_png(const RgbImage& image);

/// Writes the PNG file for `image` to `path` through a temporary file beside it and a rename,
/// so `path` is either the whole new file or untouched. Throws SwarmError(INVALID_ARGUMENT)
/// when the file cannot be written; the temporary file is removed on every failure.
void write_png(const std::filesystem::path& path, const RgbImage& image);

}  // namespace swarm::plot
