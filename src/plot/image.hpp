// An 8-bit RGB raster: what the chart draws into and the PNG writer encodes.
#pragma once

#include <cstdint>
#include <vector>

namespace swarm::plot {

/// One 8-bit sRGB colour.
struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  friend bool operator==(const Rgb&, const Rgb&) = default;
};

/// A width x height RGB image, rows top to bottom, 3 bytes a pixel. Not thread-safe.
class RgbImage {
 public:
  /// Throws std::invalid_argument unless both sides are in [1, 16384].
  RgbImage(int width, int height, Rgb fill = {255, 255, 255});

  int width() const { return width_; }
  int height() const { return height_; }
  bool contains(int x, int y) const { return x >= 0 && y >= 0 && x < width_ && y < height_; }

  /// The pixel at (x, y); (x, y) must be inside.
  Rgb at(int x, int y) const;
  /// Sets a pixel; points outside the image are ignored (so callers may draw past the edges).
  void set(int x, int y, Rgb c);
  /// Mixes `c` into a pixel with opacity `alpha` in [0, 1]; outside points are ignored.
  void blend(int x, int y, Rgb c, double alpha);
  /// Fills the rectangle [x0, x1) x [y0, y1), clipped to the image.
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);

  /// Row-major RGB bytes, width * height * 3 of them.
  const std::vector<uint8_t>& pixels() const { return pixels_; }

 private:
  int width_;
  int height_;
  std::vector<uint8_t> pixels_;
};

}  // namespace swarm::plot
