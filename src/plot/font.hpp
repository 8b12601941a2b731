// A 5x7 bitmap font for printable ASCII, drawn by our own code (chart labels and titles).
#pragma once

#include <cstdint>
#include <string_view>

#include "plot/image.hpp"

namespace swarm::plot {

/// Glyph cell: 5 x 7 pixels above the baseline, advancing 6 pixels per character at scale 1;
/// g, p, q and y hang kDescent rows below it.
inline constexpr int kGlyphWidth = 5;
inline constexpr int kGlyphHeight = 7;
inline constexpr int kGlyphAdvance = 6;
inline constexpr int kDescent = 2;

/// The 7 rows of the glyph for `c`, top first; bit 4 of a row is its leftmost pixel.
/// Characters outside printable ASCII (0x20..0x7E) get the glyph of '?'.
const uint8_t* glyph_rows(char c);

/// Rows the glyph for `c` is drawn below the top of the text line: kDescent for g, p, q, y.
int glyph_offset(char c);

/// Characters drawn for `text`: one per ASCII byte, one per UTF-8 sequence (drawn as '?').
int glyph_count(std::string_view text);

/// Width in pixels of `text` at `scale` (no trailing spacing).
int text_width(std::string_view text, int scale = 1);

/// Draws `text` with its top-left corner at (x, y); each font pixel is a scale x scale square.
void draw_text(RgbImage& image, int x, int y, std::string_view text, Rgb color, int scale = 1);

/// Draws `text` turned 90 degrees counter-clockwise (reading bottom to top), with the
/// bottom-left corner of its first glyph at (x, y): it occupies x .. x + 7*scale - 1 and
/// y - text_width + 1 .. y.
void draw_text_vertical(RgbImage& image, int x, int y, std::string_view text, Rgb color, int scale = 1);

}  // namespace swarm::plot
