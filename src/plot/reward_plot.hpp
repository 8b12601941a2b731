// From a run's metrics.jsonl (one JSON object per policy step, written by
// engine/run_files.cpp's append_step_metrics) to a reward-curve chart: the field against
// "step", a +/- std band when "<prefix>_std" accompanies "<prefix>_mean", and a moving
// average. Pure functions apart from load_metric_series's file read.
#pragma once

#include <cstddef>
#include <filesystem>
#include <istream>
#include <string>
#include <vector>

#include "plot/chart.hpp"

namespace swarm::plot {

/// One field of a metrics file, sorted by step (one point per step).
struct MetricSeries {
  std::string field;
  std::vector<double> steps, values;
  std::string std_field;     // "<prefix>_std" when field is "<prefix>_mean" and some line has it
  std::vector<double> stds;  // parallel to values when std_field is set; NaN where a line had none
  size_t lines = 0;          // non-blank lines read
  size_t malformed = 0;      // not a JSON object, or no numeric "step" (nor "global_step")
  size_t without_value = 0;  // well-formed lines whose field is missing, null or not a number
  size_t duplicates = 0;     // points replaced by a later line of the same step (resumed runs)
};

/// Parses metrics lines. Blank lines are ignored; malformed lines are counted and skipped.
/// Throws SwarmError(INVALID_ARGUMENT) when no line holds `field` (the message lists the
/// numeric fields there are) or no line gives it a finite number. `source` names the input
/// in messages.
MetricSeries parse_metric_series(std::istream& in, const std::string& field, const std::string& source);

/// parse_metric_series on a file; a run directory holding metrics.jsonl is accepted too.
/// Throws SwarmError(NOT_FOUND) when there is no such file.
MetricSeries load_metric_series(const std::filesystem::path& path, const std::string& field);

/// The metrics file for `path`: `path` itself, or path/metrics.jsonl for a directory.
std::filesystem::path resolve_metrics_file(const std::filesystem::path& path);

/// The window of the moving average for n points: about a tenth of them, at least 1.
size_t default_window(size_t n);

/// Centred moving average of `v` over `window` points (rounded up to odd); near the ends
/// the window is cut at the data (the average of the points there are).
std::vector<double> moving_average(const std::vector<double>& v, size_t window);

struct RewardChartOptions {
  std::string title;  // empty: "<field>: <project>/<experiment>" from the file's path
  int width = 800, height = 480;
};

/// The chart for a series: the band (when stds exist), the raw line and the moving average.
ChartSpec build_reward_chart(const MetricSeries& series, const RewardChartOptions& options);

/// Several series on one chart (e.g. one per configuration of an experiment): each a line in its
/// own colour with its +/- std band when it has one; labels[i] names series[i] in the legend
/// (its file's field when empty). Throws SwarmError(INVALID_ARGUMENT) on no series or more than
/// the palette's 8.
ChartSpec build_comparison_chart(const std::vector<MetricSeries>& series,
                                 const std::vector<std::string>& labels, const RewardChartOptions& options);

/// "<field>: <project>/<experiment>" for .../<project>/<experiment>/metrics.jsonl.
std::string default_title(const std::filesystem::path& metrics_file, const std::string& field);

/// One line: "reward_mean: 120 steps (1..120), first 0.12, last 0.87, min 0.1 at step 3,
/// max 0.91 at step 117".
std::string summarize(const MetricSeries& series);

}  // namespace swarm::plot
