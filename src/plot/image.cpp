#include "plot/image.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace swarm::plot {

RgbImage::RgbImage(int width, int height, Rgb fill) : width_(width), height_(height) {
  if (width < 1 || height < 1 || width > 16384 || height > 16384)
    throw std::invalid_argument("image size " + std::to_string(width) + "x" + std::to_string(height) +
                                " is outside 1..16384");
  pixels_.resize(static_cast<size_t>(width) * static_cast<size_t>(height) * 3);
  for (size_t i = 0; i < pixels_.size(); i += 3) {
    pixels_[i] = fill.r;
    pixels_[i + 1] = fill.g;
    pixels_[i + 2] = fill.b;
  }
}

Rgb RgbImage::at(int x, int y) const {
  const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(width_) + static_cast<size_t>(x)) * 3;
  return {pixels_[i], pixels_[i + 1], pixels_[i + 2]};
}

void RgbImage::set(int x, int y, Rgb c) {
  if (!contains(x, y)) return;
  const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(width_) + static_cast<size_t>(x)) * 3;
  pixels_[i] = c.r;
  pixels_[i + 1] = c.g;
  pixels_[i + 2] = c.b;
}

void RgbImage::blend(int x, int y, Rgb c, double alpha) {
  if (!contains(x, y) || !(alpha > 0.0)) return;
  if (alpha >= 1.0) return set(x, y, c);
  const size_t i = (static_cast<size_t>(y) * static_cast<size_t>(width_) + static_cast<size_t>(x)) * 3;
  auto mix = [alpha](uint8_t dst, uint8_t src) {
    return static_cast<uint8_t>(std::lround(dst + (static_cast<double>(src) - dst) * alpha));
  };
  pixels_[i] = mix(pixels_[i], c.r);
  pixels_[i + 1] = mix(pixels_[i + 1], c.g);
  pixels_[i + 2] = mix(pixels_[i + 2], c.b);
}

void RgbImage::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  x0 = std::max(x0, 0);
  y0 = std::max(y0, 0);
  x1 = std::min(x1, width_);
  y1 = std::min(y1, height_);
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) set(x, y, c);
}

}  // namespace swarm::plot
