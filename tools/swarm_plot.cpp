// swarm-plot: a run's metrics.jsonl as a reward-curve PNG (the field against step, a +/- std band, a moving average).
//   swarm-plot --metrics experiments/echo/echo-agent/metrics.jsonl --out reward.png
//   swarm-plot --metrics experiments/echo/echo-agent --field loss --title "echo loss" --width 1200 --height 600
//   swarm-plot --metrics a.jsonl --label "run a" --metrics b.jsonl --label "run b" --out compare.png

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "common/error.hpp"
#include "plot/png_writer.hpp"
#include "plot/reward_plot.hpp"

int main(int argc, char** argv) {
  namespace plot = swarm::plot;
  CLI::App app{"swarm-plot: draw a run's metrics.jsonl as a reward-curve PNG"};
  std::vector<std::string> metrics, labels;
  std::string out = "reward.png", field = "reward_mean", title;
  int width = 800, height = 480;
  app.add_option(
         "--metrics", metrics,
         "metrics.jsonl of a run (or the run directory holding it); several draw one line each on one chart")
      ->required();
  app.add_option("--label", labels, "Legend label of each --metrics, in order (several series)");
  app.add_option("--out", out, "PNG file to write")->capture_default_str();
  app.add_option("--field", field, "Numeric field to plot against step")->capture_default_str();
  app.add_option("--title", title, "Chart title (default: <field>: <project>/<experiment>)");
  app.add_option("--width", width, "Image width in pixels")
      ->capture_default_str()
      ->check(CLI::Range(160, 8192));
  app.add_option("--height", height, "Image height in pixels")
      ->capture_default_str()
      ->check(CLI::Range(120, 8192));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is not an error; every usage error exits 2
  }

  try {
    if (metrics.size() > 1) {  // a comparison: one line (and band) per file
      std::vector<plot::MetricSeries> all;
      for (const auto& m : metrics) all.push_back(plot::load_metric_series(m, field));
      plot::RewardChartOptions options;
      options.title = title.empty() ? field : title;
      options.width = width;
      options.height = height;
      plot::write_png(out, plot::render_chart(plot::build_comparison_chart(all, labels, options)));
      std::printf("wrote %s (%dx%d, %zu series)\n", out.c_str(), width, height, all.size());
      for (size_t k = 0; k < all.size(); ++k)
        std::printf("%s: %s\n", k < labels.size() ? labels[k].c_str() : metrics[k].c_str(),
                    plot::summarize(all[k]).c_str());
      return 0;
    }
    const plot::MetricSeries series = plot::load_metric_series(metrics.front(), field);
    if (series.malformed > 0)
      std::fprintf(stderr, "swarm-plot: warning: skipped %zu malformed line(s) of %zu\n", series.malformed,
                   series.lines);
    if (series.without_value > 0)
      std::fprintf(stderr, "swarm-plot: note: %zu line(s) without a finite '%s'\n", series.without_value,
                   field.c_str());
    if (series.duplicates > 0)
      std::fprintf(stderr, "swarm-plot: note: %zu step(s) logged more than once, the last line kept\n",
                   series.duplicates);
    plot::RewardChartOptions options;
    options.title = title.empty() ? plot::default_title(metrics.front(), field) : title;
    options.width = width;
    options.height = height;
    const plot::RgbImage image = plot::render_chart(plot::build_reward_chart(series, options));
    plot::write_png(out, image);
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(out, ec);
    std::printf("wrote %s (%dx%d, %.1f KiB)\n", out.c_str(), width, height, ec ? 0.0 : bytes / 1024.0);
    std::printf("%s\n", plot::summarize(series).c_str());
    return 0;
  } catch (const swarm::SwarmError& e) {
    const bool input =
        e.kind() == swarm::ErrorKind::INVALID_ARGUMENT || e.kind() == swarm::ErrorKind::NOT_FOUND;
    std::fprintf(stderr, "swarm-plot: error: %s\n", e.what());
    return input ? 2 : 1;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "swarm-plot: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swarm-plot: unexpected error: %s\n", e.what());
    return 1;
  }
}
