// A line chart drawn into an RgbImage: shaded bands, anti-aliased lines, axes with "nice"
// ticks and numeric labels, grid, title, axis titles and a legend in the emptiest corner.
// Pure functions over their arguments; thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "plot/image.hpp"

namespace swarm::plot {

/// A polyline through (x[i], y[i]); x ascending, x.size() == y.size().
struct LineSeries {
  std::string label;  // legend text; empty = not in the legend
  std::vector<double> x, y;
  Rgb color;
  double width = 2.0;  // pixels
};

/// The region between lo[i] and hi[i] over x[i] (x ascending), filled with `color` at `alpha`.
struct BandSeries {
  std::string label;
  std::vector<double> x, lo, hi;
  Rgb color;
  double alpha = 0.22;
};

/// What to draw. Text is drawn in printable ASCII (other characters become '?').
struct ChartSpec {
  std::string title, x_label, y_label;
  int width = 800, height = 480;
  bool integer_x = false;         // x ticks only at whole numbers (steps)
  std::vector<BandSeries> bands;  // drawn first, under the lines
  std::vector<LineSeries> lines;  // drawn in order, the last on top
};

/// One axis: its range, tick spacing and tick positions (multiples of step in [min, max]).
struct Axis {
  double min = 0.0, max = 1.0, step = 0.2;
  std::vector<double> ticks;
};

/// Where render_chart put things: the plot frame (pixel rows/columns of its border lines)
/// and the axes, so callers and tests can map data to pixels.
struct ChartLayout {
  int left = 0, top = 0, right = 0, bottom = 0;
  Axis x, y;
  int legend_left = 0, legend_top = 0, legend_right = 0, legend_bottom = 0;  // empty when no legend

  /// Pixel coordinates (continuous; the centre of pixel column c is c + 0.5) of a data point.
  double to_px_x(double v) const;
  double to_px_y(double v) const;
};

/// An axis over exactly [lo, hi] with ticks at the multiples of a step of 1, 2, 2.5 or 5
/// times a power of ten, about `target_ticks` of them (at least one); whole-number steps only
/// when `integer`. An empty range (lo == hi) is widened around the value.
Axis make_axis(double lo, double hi, int target_ticks, bool integer);

/// A tick label for `v` with as many decimals as `step` needs ("0.25", "120", "1e+06").
std::string format_tick(double v, double step);

/// Draws the chart. Throws std::invalid_argument when no series has a finite point, when a
/// series' vectors differ in length, or when the size is below 160 x 120.
RgbImage render_chart(const ChartSpec& spec, ChartLayout* layout = nullptr);

}  // namespace swarm::plot
