#include "plot/reward_plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.hpp"
#include "common/json_nesting.hpp"

namespace swarm::plot {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr Rgb kRawColor{31, 119, 180};
constexpr Rgb kAverageColor{255, 127, 14};

bool finite_number(const json& j) { return j.is_number() && std::isfinite(j.get<double>()); }

std::string format_value(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Steps are whole numbers in practice: print them in full ("12345", not "1.234e+04").
std::string format_step(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  return format_value(v);
}

// A field of a metrics line: a top-level key, or "log_metrics.<name>[.mean|.min|.max|.episodes]"
// for what the agents sent (append_step_metrics nests it; a bare name means its mean).
const json* find_field(const json& line, const std::string& field) {
  if (auto it = line.find(field); it != line.end()) return &*it;
  static const std::string prefix = "log_metrics.";
  if (!field.starts_with(prefix)) return nullptr;
  const auto logged = line.find("log_metrics");
  if (logged == line.end() || !logged->is_object()) return nullptr;
  std::string name = field.substr(prefix.size()), stat = "mean";
  for (const char* s : {".mean", ".min", ".max", ".episodes"})
    if (name.ends_with(s) && !logged->contains(name)) {
      stat = std::string(s).substr(1);
      name.resize(name.size() - stat.size() - 1);
      break;
    }
  const auto entry = logged->find(name);
  if (entry == logged->end() || !entry->is_object()) return nullptr;
  const auto value = entry->find(stat);
  return value == entry->end() ? nullptr : &*value;
}

}  // namespace

MetricSeries parse_metric_series(std::istream& in, const std::string& field, const std::string& source) {
  MetricSeries s;
  s.field = field;
  const std::string suffix = "_mean";
  const bool has_std_name = field.size() > suffix.size() && field.ends_with(suffix);
  const std::string std_name = has_std_name ? field.substr(0, field.size() - suffix.size()) + "_std" : "";

  struct Point {
    double value, std;
  };
  std::map<double, Point> by_step;  // a later line of the same step replaces the earlier
  std::set<std::string> numeric_fields;
  size_t well_formed = 0;
  bool field_seen = false, std_seen = false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++s.lines;
    const json j = json_nesting_within(line) ? json::parse(line, nullptr, /*allow_exceptions=*/false)
                                             : json(json::value_t::discarded);
    if (j.is_discarded() || !j.is_object()) {
      ++s.malformed;
      continue;
    }
    const json* step = nullptr;
    for (const char* key : {"step", "global_step"})
      if (auto it = j.find(key); it != j.end() && finite_number(*it)) {
        step = &*it;
        break;
      }
    if (!step) {
      ++s.malformed;
      continue;
    }
    ++well_formed;
    for (const auto& [k, v] : j.items())
      if (v.is_number() || v.is_null()) numeric_fields.insert(k);
    if (auto logged = j.find("log_metrics"); logged != j.end() && logged->is_object())
      for (const auto& [name, v] : logged->items()) numeric_fields.insert("log_metrics." + name + ".mean");
    const json* value = find_field(j, field);
    if (value) field_seen = true;
    if (!value || !finite_number(*value)) {
      ++s.without_value;
      continue;
    }
    double sd = std::numeric_limits<double>::quiet_NaN();
    if (has_std_name)
      if (auto st = j.find(std_name); st != j.end() && finite_number(*st)) {
        sd = st->get<double>();
        std_seen = true;
      }
    auto [pos, inserted] = by_step.insert_or_assign(step->get<double>(), Point{value->get<double>(), sd});
    if (!inserted) ++s.duplicates;
  }

  if (well_formed == 0)
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     "no usable points in " + source + ": " +
                         (s.lines == 0 ? std::string("it is empty")
                                       : std::to_string(s.malformed) + " malformed line(s), none usable"));
  if (!field_seen) {
    std::string known;
    size_t shown = 0;
    for (const auto& k : numeric_fields) {
      if (shown++ == 40) {
        known += ", ...";
        break;
      }
      known += (known.empty() ? "" : ", ") + k;
    }
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     "unknown field '" + field + "' in " + source + " (fields: " + known + ")");
  }
  if (by_step.empty())
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     "no usable points in " + source + ": '" + field + "' is never a finite number");

  if (std_seen) s.std_field = std_name;
  for (const auto& [step, p] : by_step) {
    s.steps.push_back(step);
    s.values.push_back(p.value);
    if (std_seen) s.stds.push_back(p.std);
  }
  return s;
}

fs::path resolve_metrics_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return path / "metrics.jsonl";
  return path;
}

MetricSeries load_metric_series(const fs::path& path, const std::string& field) {
  const fs::path file = resolve_metrics_file(path);
  std::error_code ec;
  SWARM_REQUIRE(fs::is_regular_file(file, ec), ErrorKind::NOT_FOUND,
                "metrics file '" + file.string() + "' does not exist");
  std::ifstream in(file);
  SWARM_REQUIRE(in.is_open(), ErrorKind::NOT_FOUND, "cannot open metrics file '" + file.string() + "'");
  return parse_metric_series(in, field, file.string());
}

size_t default_window(size_t n) { return std::max<size_t>(1, (n + 5) / 10); }

std::vector<double> moving_average(const std::vector<double>& v, size_t window) {
  const size_t n = v.size(), half = window / 2;
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + v[i];
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t lo = i >= half ? i - half : 0, hi = std::min(n - 1, i + half);
    out[i] = (prefix[hi + 1] - prefix[lo]) / static_cast<double>(hi - lo + 1);
  }
  return out;
}

std::string default_title(const fs::path& metrics_file, const std::string& field) {
  std::error_code ec;
  fs::path dir = fs::absolute(resolve_metrics_file(metrics_file), ec).parent_path();
  if (ec) return field;
  const std::string experiment = dir.filename().string(), project = dir.parent_path().filename().string();
  if (experiment.empty()) return field;
  return field + ": " + (project.empty() ? experiment : project + "/" + experiment);
}

namespace {

// The +/- std band of a series where it has a std (an empty band when it has none). A reward
// whose every value lies in [0, 1] is taken to live there: its band is clipped to it (mean +
// std of rewards in [0, 1] can pass 1, a reward cannot).
BandSeries std_band(const MetricSeries& s, std::string label, Rgb color, double alpha) {
  BandSeries band{std::move(label), {}, {}, {}, color, alpha};
  if (s.std_field.empty()) return band;
  const bool unit_reward =
      s.field.find("reward") != std::string::npos &&
      std::all_of(s.values.begin(), s.values.end(), [](double v) { return v >= 0 && v <= 1; });
  const double lo = unit_reward ? 0.0 : -INFINITY, hi = unit_reward ? 1.0 : INFINITY;
  for (size_t i = 0; i < s.values.size(); ++i) {
    if (!std::isfinite(s.stds[i])) continue;
    band.x.push_back(s.steps[i]);
    band.lo.push_back(std::max(lo, s.values[i] - s.stds[i]));
    band.hi.push_back(std::min(hi, s.values[i] + s.stds[i]));
  }
  return band;
}

}  // namespace

ChartSpec build_reward_chart(const MetricSeries& s, const RewardChartOptions& options) {
  ChartSpec spec;
  spec.title = options.title;
  spec.width = options.width;
  spec.height = options.height;
  spec.x_label = "step";
  spec.y_label = s.field;
  spec.integer_x = std::all_of(s.steps.begin(), s.steps.end(), [](double x) { return x == std::floor(x); });

  if (BandSeries band = std_band(s, "+/- " + s.std_field, kRawColor, 0.18); !band.x.empty())
    spec.bands.push_back(std::move(band));
  const size_t n = s.values.size();
  spec.lines.push_back({s.field, s.steps, s.values, kRawColor, n > 200 ? 1.5 : 2.0});
  const size_t window = default_window(n);
  if (window >= 2)
    spec.lines.push_back({"moving avg (" + std::to_string(window | 1) + " steps)", s.steps,
                          moving_average(s.values, window), kAverageColor, 2.5});
  return spec;
}

ChartSpec build_comparison_chart(const std::vector<MetricSeries>& series,
                                 const std::vector<std::string>& labels, const RewardChartOptions& options) {
  static constexpr Rgb kPalette[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                                     {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127}};
  constexpr size_t kColors = sizeof(kPalette) / sizeof(kPalette[0]);
  SWARM_REQUIRE(!series.empty(), ErrorKind::INVALID_ARGUMENT, "no series to draw");
  SWARM_REQUIRE(series.size() <= kColors, ErrorKind::INVALID_ARGUMENT,
                "at most " + std::to_string(kColors) + " series on one chart");
  ChartSpec spec;
  spec.title = options.title;
  spec.width = options.width;
  spec.height = options.height;
  spec.x_label = "step";
  spec.y_label = series.front().field;
  spec.integer_x = true;
  for (size_t k = 0; k < series.size(); ++k) {
    const MetricSeries& s = series[k];
    const std::string label = k < labels.size() && !labels[k].empty() ? labels[k] : s.field;
    spec.integer_x = spec.integer_x &&
                     std::all_of(s.steps.begin(), s.steps.end(), [](double x) { return x == std::floor(x); });
    if (BandSeries band = std_band(s, "", kPalette[k], 0.14); !band.x.empty())
      spec.bands.push_back(std::move(band));
    spec.lines.push_back({label, s.steps, s.values, kPalette[k], 2.0});
  }
  return spec;
}

std::string summarize(const MetricSeries& s) {
  if (s.values.empty()) return s.field + ": no points";
  const auto [lo, hi] = std::minmax_element(s.values.begin(), s.values.end());
  const auto at = [&](auto it) { return format_step(s.steps[static_cast<size_t>(it - s.values.begin())]); };
  return s.field + ": " + std::to_string(s.values.size()) + (s.values.size() == 1 ? " step (" : " steps (") +
         format_step(s.steps.front()) + ".." + format_step(s.steps.back()) + "), first " +
         format_value(s.values.front()) + ", last " + format_value(s.values.back()) + ", min " +
         format_value(*lo) + " at step " + at(lo) + ", max " + format_value(*hi) + " at step " + at(hi);
}

}  // namespace swarm::plot
