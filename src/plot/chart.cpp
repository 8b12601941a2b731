#include "plot/chart.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "plot/font.hpp"

namespace swarm::plot {
namespace {

constexpr Rgb kBackground{255, 255, 255};
constexpr Rgb kGrid{233, 233, 233};
constexpr Rgb kFrame{90, 90, 90};
constexpr Rgb kText{30, 30, 30};
constexpr Rgb kLegendBorder{190, 190, 190};
constexpr int kTickLength = 5;
constexpr int kTitleScale = 2;

struct Clip {
  int x0, y0, x1, y1;  // inclusive
  bool inside(int x, int y) const { return x >= x0 && x <= x1 && y >= y0 && y <= y1; }
};

// Printable ASCII only, so widths measured here are the widths drawn.
std::string to_ascii(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else if (c < 0x80 || (c & 0xC0) != 0x80) {
      out += '?';
    }
  }
  return out;
}

// `text` cut (ending in "...") to at most `max_width` pixels at `scale`.
std::string fit_text(std::string text, int max_width, int scale) {
  if (text_width(text, scale) <= max_width) return text;
  while (!text.empty() && text_width(text + "...", scale) > max_width) text.pop_back();
  return text.empty() ? text : text + "...";
}

double nice_step(double raw) {
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / p;
  return (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 2.5 ? 2.5 : f <= 5.0 ? 5.0 : 10.0) * p;
}

// Anti-aliased thick segment: each pixel within the clip gets the colour with coverage
// from its centre's distance to the segment.
void draw_segment(RgbImage& img, const Clip& clip, double ax, double ay, double bx, double by, double width,
                  Rgb color) {
  const double hw = width / 2.0;
  const int x0 = std::max(clip.x0, static_cast<int>(std::floor(std::min(ax, bx) - hw - 1)));
  const int x1 = std::min(clip.x1, static_cast<int>(std::ceil(std::max(ax, bx) + hw + 1)));
  const int y0 = std::max(clip.y0, static_cast<int>(std::floor(std::min(ay, by) - hw - 1)));
  const int y1 = std::min(clip.y1, static_cast<int>(std::ceil(std::max(ay, by) + hw + 1)));
  const double dx = bx - ax, dy = by - ay, len2 = dx * dx + dy * dy;
  for (int y = y0; y <= y1; ++y) {
    for (int x = x0; x <= x1; ++x) {
      const double px = x + 0.5, py = y + 0.5;
      double t = len2 > 0.0 ? ((px - ax) * dx + (py - ay) * dy) / len2 : 0.0;
      t = std::clamp(t, 0.0, 1.0);
      const double ex = ax + t * dx - px, ey = ay + t * dy - py;
      const double coverage = std::clamp(hw + 0.5 - std::sqrt(ex * ex + ey * ey), 0.0, 1.0);
      img.blend(x, y, color, coverage);
    }
  }
}

void draw_hline(RgbImage& img, int x0, int x1, int y, Rgb c) { img.fill_rect(x0, y, x1 + 1, y + 1, c); }
void draw_vline(RgbImage& img, int x, int y0, int y1, Rgb c) { img.fill_rect(x, y0, x + 1, y1 + 1, c); }

// The value of a piecewise-linear function through (xs, vs) at x (x within the xs range).
double interpolate(const std::vector<double>& xs, const std::vector<double>& vs, double x) {
  const auto it = std::upper_bound(xs.begin(), xs.end(), x);
  if (it == xs.begin()) return vs.front();
  if (it == xs.end()) return vs.back();
  const size_t i = static_cast<size_t>(it - xs.begin());
  const double x0 = xs[i - 1], x1 = xs[i];
  const double t = x1 > x0 ? (x - x0) / (x1 - x0) : 1.0;
  return vs[i - 1] + t * (vs[i] - vs[i - 1]);
}

// Per pixel column, the envelope (min lo, max hi) over the data in that column, filled.
void draw_band(RgbImage& img, const ChartLayout& L, const BandSeries& band) {
  if (band.x.empty()) return;
  const double span = L.x.max - L.x.min, w = L.right - L.left;
  auto data_x = [&](double px) { return L.x.min + (px - L.left - 0.5) / w * span; };
  for (int c = L.left + 1; c < L.right; ++c) {
    double va = data_x(c), vb = data_x(c + 1);
    if (vb < band.x.front() || va > band.x.back()) continue;
    va = std::max(va, band.x.front());
    vb = std::min(vb, band.x.back());
    double lo = std::min(interpolate(band.x, band.lo, va), interpolate(band.x, band.lo, vb));
    double hi = std::max(interpolate(band.x, band.hi, va), interpolate(band.x, band.hi, vb));
    const auto first = std::lower_bound(band.x.begin(), band.x.end(), va);
    const auto last = std::upper_bound(band.x.begin(), band.x.end(), vb);
    for (auto it = first; it != last; ++it) {
      const size_t i = static_cast<size_t>(it - band.x.begin());
      lo = std::min(lo, band.lo[i]);
      hi = std::max(hi, band.hi[i]);
    }
    const int r0 = std::max(L.top + 1, static_cast<int>(std::floor(L.to_px_y(hi))));
    const int r1 = std::min(L.bottom - 1, std::max(r0, static_cast<int>(std::ceil(L.to_px_y(lo))) - 1));
    for (int r = r0; r <= r1; ++r) img.blend(c, r, band.color, band.alpha);
  }
}

void draw_line(RgbImage& img, const ChartLayout& L, const LineSeries& line) {
  const Clip clip{L.left + 1, L.top + 1, L.right - 1, L.bottom - 1};
  if (line.x.size() == 1) {  // a lone point: a dot
    const double px = L.to_px_x(line.x[0]), py = L.to_px_y(line.y[0]);
    draw_segment(img, clip, px, py, px, py, line.width + 2.0, line.color);
    return;
  }
  for (size_t i = 1; i < line.x.size(); ++i)
    draw_segment(img, clip, L.to_px_x(line.x[i - 1]), L.to_px_y(line.y[i - 1]), L.to_px_x(line.x[i]),
                 L.to_px_y(line.y[i]), line.width, line.color);
}

// Pixels in the rectangle that something was drawn on (not background, not grid).
int ink_in(const RgbImage& img, int x0, int y0, int x1, int y1) {
  int n = 0;
  for (int y = std::max(0, y0); y <= std::min(img.height() - 1, y1); ++y)
    for (int x = std::max(0, x0); x <= std::min(img.width() - 1, x1); ++x) {
      const Rgb c = img.at(x, y);
      if (c != kBackground && c != kGrid) ++n;
    }
  return n;
}

void draw_legend(RgbImage& img, ChartLayout& L, const ChartSpec& spec) {
  struct Entry {
    std::string label;
    const LineSeries* line;
    const BandSeries* band;
  };
  std::vector<Entry> entries;
  for (const auto& l : spec.lines)
    if (!l.label.empty()) entries.push_back({to_ascii(l.label), &l, nullptr});
  for (const auto& b : spec.bands)
    if (!b.label.empty()) entries.push_back({to_ascii(b.label), nullptr, &b});
  if (entries.empty()) return;

  constexpr int kPad = 6, kSwatch = 20, kRow = 13, kInset = 8;
  const int max_text = std::max(20, L.right - L.left - 2 * kInset - 3 * kPad - kSwatch);
  int text_w = 0;
  for (auto& e : entries) {
    e.label = fit_text(e.label, max_text, 1);
    text_w = std::max(text_w, text_width(e.label));
  }
  const int box_w = kPad + kSwatch + kPad + text_w + kPad;
  const int box_h = kPad + static_cast<int>(entries.size()) * kRow - (kRow - kGlyphHeight) + kPad;

  // The corner that hides the least of what is drawn; ties go to the earlier corner.
  const std::array<std::pair<int, int>, 4> corners = {{
      {L.right - kInset - box_w, L.top + kInset},             // top right
      {L.left + kInset + 1, L.top + kInset},                  // top left
      {L.right - kInset - box_w, L.bottom - kInset - box_h},  // bottom right
      {L.left + kInset + 1, L.bottom - kInset - box_h},       // bottom left
  }};
  int best = 0, best_ink = std::numeric_limits<int>::max();
  for (int i = 0; i < 4; ++i) {
    const auto [x, y] = corners[static_cast<size_t>(i)];
    const int ink = ink_in(img, x, y, x + box_w - 1, y + box_h - 1);
    if (ink < best_ink) {
      best = i;
      best_ink = ink;
    }
  }
  const auto [x, y] = corners[static_cast<size_t>(best)];
  img.fill_rect(x, y, x + box_w, y + box_h, kBackground);
  draw_hline(img, x, x + box_w - 1, y, kLegendBorder);
  draw_hline(img, x, x + box_w - 1, y + box_h - 1, kLegendBorder);
  draw_vline(img, x, y, y + box_h - 1, kLegendBorder);
  draw_vline(img, x + box_w - 1, y, y + box_h - 1, kLegendBorder);
  const Clip all{0, 0, img.width() - 1, img.height() - 1};
  for (size_t i = 0; i < entries.size(); ++i) {
    const int row_y = y + kPad + static_cast<int>(i) * kRow;
    const int sx = x + kPad;
    if (entries[i].line) {
      const double cy = row_y + kGlyphHeight / 2.0;
      draw_segment(img, all, sx + 1, cy, sx + kSwatch - 1, cy, entries[i].line->width,
                   entries[i].line->color);
    } else {
      for (int yy = row_y; yy < row_y + kGlyphHeight; ++yy)
        for (int xx = sx; xx < sx + kSwatch; ++xx)
          img.blend(xx, yy, entries[i].band->color, entries[i].band->alpha);
    }
    draw_text(img, sx + kSwatch + kPad, row_y, entries[i].label, kText);
  }
  L.legend_left = x;
  L.legend_top = y;
  L.legend_right = x + box_w - 1;
  L.legend_bottom = y + box_h - 1;
}

}  // namespace

double ChartLayout::to_px_x(double v) const {
  return left + 0.5 + (v - x.min) / (x.max - x.min) * (right - left);
}

double ChartLayout::to_px_y(double v) const {
  return bottom + 0.5 - (v - y.min) / (y.max - y.min) * (bottom - top);
}

Axis make_axis(double lo, double hi, int target_ticks, bool integer) {
  if (!(hi > lo)) {
    const double d = integer ? 1.0 : (lo == 0.0 ? 1.0 : std::fabs(lo) * 0.1);
    lo -= d;
    hi += d;
  }
  Axis a;
  a.min = lo;
  a.max = hi;
  a.step = nice_step((hi - lo) / std::max(2, target_ticks));
  // Whole numbers (steps) get whole ticks: at least 1, and 5 where the nice step is 2.5.
  if (integer) a.step = a.step < 1.0 ? 1.0 : a.step == 2.5 ? 5.0 : a.step;
  // step <= 2 * range / target <= range, so at least one tick falls inside.
  const double k0 = std::ceil(lo / a.step - 1e-9), k1 = std::floor(hi / a.step + 1e-9);
  for (double k = k0; k <= k1 + 0.5; k += 1.0) a.ticks.push_back(k * a.step);
  return a;
}

std::string format_tick(double v, double step) {
  if (std::fabs(v) < step * 1e-6) v = 0.0;  // no "-0.00"
  int decimals = 0;  // the fewest that write `step` exactly (0.25 -> 2, 0.5 -> 1, 20 -> 0)
  while (decimals < 10) {
    const double scaled = step * std::pow(10.0, decimals);
    if (std::fabs(scaled - std::round(scaled)) < 1e-6 * scaled) break;
    ++decimals;
  }
  char buf[64];
  if (std::fabs(v) >= 1e7 || decimals > 6) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  }
  return buf;
}

RgbImage render_chart(const ChartSpec& spec, ChartLayout* layout_out) {
  if (spec.width < 160 || spec.height < 120)
    throw std::invalid_argument("chart size " + std::to_string(spec.width) + "x" +
                                std::to_string(spec.height) + " is below 160x120");
  // Only finite points count; they set the ranges.
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  std::vector<LineSeries> lines;
  std::vector<BandSeries> bands;
  for (const auto& l : spec.lines) {
    if (l.x.size() != l.y.size())
      throw std::invalid_argument("line '" + l.label + "': x and y differ in length");
    LineSeries f{l.label, {}, {}, l.color, l.width};
    for (size_t i = 0; i < l.x.size(); ++i) {
      if (!std::isfinite(l.x[i]) || !std::isfinite(l.y[i])) continue;
      f.x.push_back(l.x[i]);
      f.y.push_back(l.y[i]);
      x_lo = std::min(x_lo, l.x[i]);
      x_hi = std::max(x_hi, l.x[i]);
      y_lo = std::min(y_lo, l.y[i]);
      y_hi = std::max(y_hi, l.y[i]);
    }
    lines.push_back(std::move(f));
  }
  for (const auto& b : spec.bands) {
    if (b.x.size() != b.lo.size() || b.x.size() != b.hi.size())
      throw std::invalid_argument("band '" + b.label + "': x, lo and hi differ in length");
    BandSeries f{b.label, {}, {}, {}, b.color, b.alpha};
    for (size_t i = 0; i < b.x.size(); ++i) {
      if (!std::isfinite(b.x[i]) || !std::isfinite(b.lo[i]) || !std::isfinite(b.hi[i])) continue;
      f.x.push_back(b.x[i]);
      f.lo.push_back(std::min(b.lo[i], b.hi[i]));
      f.hi.push_back(std::max(b.lo[i], b.hi[i]));
      x_lo = std::min(x_lo, b.x[i]);
      x_hi = std::max(x_hi, b.x[i]);
      y_lo = std::min(y_lo, f.lo.back());
      y_hi = std::max(y_hi, f.hi.back());
    }
    bands.push_back(std::move(f));
  }
  if (!(x_lo <= x_hi)) throw std::invalid_argument("nothing to plot: no finite points");

  RgbImage img(spec.width, spec.height, kBackground);
  ChartLayout L;
  const std::string title = to_ascii(spec.title), x_label = to_ascii(spec.x_label),
                    y_label = to_ascii(spec.y_label);

  // Vertical layout first: it decides the y ticks, whose labels decide the left margin.
  L.top = title.empty() ? 14 : 12 + kGlyphHeight * kTitleScale + 12;
  L.bottom =
      spec.height - 1 - (kTickLength + 5 + kGlyphHeight + (x_label.empty() ? 8 : 10 + kGlyphHeight + 8));
  const double y_pad = (y_hi - y_lo) * 0.04;
  L.y = make_axis(y_lo - y_pad, y_hi + y_pad, std::max(2, (L.bottom - L.top) / 55), false);
  std::vector<std::string> y_tick_labels;
  int y_label_w = 0;
  for (double v : L.y.ticks) {
    y_tick_labels.push_back(format_tick(v, L.y.step));
    y_label_w = std::max(y_label_w, text_width(y_tick_labels.back()));
  }
  L.left = 10 + (y_label.empty() ? 0 : kGlyphHeight + 10) + y_label_w + 5 + kTickLength;
  L.right = spec.width - 1 - 24;
  if (L.right - L.left < 40 || L.bottom - L.top < 40)
    throw std::invalid_argument("chart size " + std::to_string(spec.width) + "x" +
                                std::to_string(spec.height) + " leaves no room to plot");
  L.x = make_axis(x_lo, x_hi, std::max(2, (L.right - L.left) / 90), spec.integer_x);

  // Grid, then data, then frame and labels over it.
  for (double v : L.y.ticks)
    draw_hline(img, L.left, L.right, static_cast<int>(std::floor(L.to_px_y(v))), kGrid);
  for (double v : L.x.ticks)
    draw_vline(img, static_cast<int>(std::floor(L.to_px_x(v))), L.top, L.bottom, kGrid);
  for (const auto& b : bands) draw_band(img, L, b);
  for (const auto& l : lines)
    if (!l.x.empty()) draw_line(img, L, l);

  draw_hline(img, L.left, L.right, L.top, kFrame);
  draw_hline(img, L.left, L.right, L.bottom, kFrame);
  draw_vline(img, L.left, L.top, L.bottom, kFrame);
  draw_vline(img, L.right, L.top, L.bottom, kFrame);
  for (size_t i = 0; i < L.y.ticks.size(); ++i) {
    const int py = static_cast<int>(std::floor(L.to_px_y(L.y.ticks[i])));
    draw_hline(img, L.left - kTickLength, L.left - 1, py, kFrame);
    const std::string& s = y_tick_labels[i];
    draw_text(img, L.left - kTickLength - 4 - text_width(s), py - kGlyphHeight / 2, s, kText);
  }
  int last_label_end = std::numeric_limits<int>::min();
  for (double v : L.x.ticks) {
    const int px = static_cast<int>(std::floor(L.to_px_x(v)));
    draw_vline(img, px, L.bottom + 1, L.bottom + kTickLength, kFrame);
    const std::string s = format_tick(v, L.x.step);
    const int x0 = px - text_width(s) / 2;
    if (x0 <= last_label_end + 6) continue;  // would touch the previous label
    draw_text(img, x0, L.bottom + kTickLength + 5, s, kText);
    last_label_end = x0 + text_width(s);
  }
  if (!x_label.empty()) {
    const std::string s = fit_text(x_label, L.right - L.left, 1);
    draw_text(img, (L.left + L.right) / 2 - text_width(s) / 2, L.bottom + kTickLength + 5 + kGlyphHeight + 10,
              s, kText);
  }
  if (!y_label.empty()) {
    const std::string s = fit_text(y_label, L.bottom - L.top, 1);
    draw_text_vertical(img, 10, (L.top + L.bottom) / 2 + text_width(s) / 2, s, kText);
  }
  if (!title.empty()) {
    const std::string s = fit_text(title, spec.width - 20, kTitleScale);
    draw_text(img, spec.width / 2 - text_width(s, kTitleScale) / 2, 12, s, kText, kTitleScale);
  }
  draw_legend(img, L, spec);
  if (layout_out) *layout_out = L;
  return img;
}

}  // namespace swarm::plot
