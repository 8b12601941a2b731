// swarm-plot: the PNG files (decoded again with libpng's own reader), the bitmap font, the
// chart layout, metrics parsing, and the tool's exit codes.
#include <gtest/gtest.h>
#include <png.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "plot/chart.hpp"
#include "plot/font.hpp"
#include "plot/png_writer.hpp"
#include "plot/reward_plot.hpp"
#include "support/scratch_dir.hpp"

namespace swarm::plot {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

uint32_t be32(const Bytes& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) | b[at + 3];
}

Bytes bytes_of_file(const fs::path& p) {
  const std::string s = swarm::testing::read_file(p);
  return Bytes(s.begin(), s.end());
}

struct DecodedPng {
  uint32_t width = 0, height = 0;
  uint32_t format = 0;  // the file's own sample format, as libpng reports it before converting
  Bytes rgb;            // 8-bit RGB, rows top to bottom
};

// Decodes with libpng's simplified read API (its own reader: checks every chunk CRC and the
// zlib stream). Throws std::runtime_error with libpng's message when the file is bad.
DecodedPng decode_png(const Bytes& png) {
  struct ImageGuard {
    png_image image{};
    ~ImageGuard() { png_image_free(&image); }
  } g;
  g.image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&g.image, png.data(), png.size()))
    throw std::runtime_error(std::string("libpng: ") + g.image.message);
  DecodedPng d;
  d.width = g.image.width;
  d.height = g.image.height;
  d.format = g.image.format;
  g.image.format = PNG_FORMAT_RGB;
  d.rgb.resize(PNG_IMAGE_SIZE(g.image));
  if (!png_image_finish_read(&g.image, nullptr, d.rgb.data(), 0, nullptr))
    throw std::runtime_error(std::string("libpng: ") + g.image.message);
  return d;
}

// The signature and the IHDR chunk, read from the bytes: 8-bit truecolour, no interlace.
void expect_rgb8_header(const Bytes& png, uint32_t width, uint32_t height) {
  const Bytes sig = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  ASSERT_GE(png.size(), 33u);
  EXPECT_TRUE(std::equal(sig.begin(), sig.end(), png.begin()));
  EXPECT_EQ(be32(png, 8), 13u);  // IHDR length
  EXPECT_EQ(std::string(png.begin() + 12, png.begin() + 16), "IHDR");
  EXPECT_EQ(be32(png, 16), width);
  EXPECT_EQ(be32(png, 20), height);
  EXPECT_EQ(png[24], 8);  // bit depth
  EXPECT_EQ(png[25], 2);  // colour type: truecolour RGB
  EXPECT_EQ(png[28], 0);  // no interlace
}

// Decodes `png` and checks it holds exactly `img`.
void expect_png_of(const Bytes& png, const RgbImage& img) {
  expect_rgb8_header(png, static_cast<uint32_t>(img.width()), static_cast<uint32_t>(img.height()));
  const DecodedPng d = decode_png(png);
  EXPECT_EQ(d.width, static_cast<uint32_t>(img.width()));
  EXPECT_EQ(d.height, static_cast<uint32_t>(img.height()));
  EXPECT_EQ(d.format, static_cast<uint32_t>(PNG_FORMAT_RGB));  // 8-bit RGB in the file, no alpha, no palette
  ASSERT_EQ(d.rgb.size(), img.pixels().size());
  for (size_t i = 0; i < d.rgb.size(); ++i)
    ASSERT_EQ(d.rgb[i], img.pixels()[i]) << "pixel " << (i / 3) % static_cast<size_t>(img.width()) << ","
                                         << i / 3 / static_cast<size_t>(img.width()) << " channel " << i % 3;
}

// A test image: gradient plus a flat area.
RgbImage test_image(int w, int h) {
  RgbImage img(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      img.set(
          x, y,
          {static_cast<uint8_t>(x * 7), static_cast<uint8_t>(y * 5), static_cast<uint8_t>((x ^ y) & 0xF0)});
  img.fill_rect(2, 2, w / 2, h / 2, {255, 255, 255});
  return img;
}

RgbImage noise_image(int w, int h, unsigned seed) {
  std::mt19937 rng(seed);
  RgbImage img(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      img.set(x, y, {static_cast<uint8_t>(rng()), static_cast<uint8_t>(rng()), static_cast<uint8_t>(rng())});
  return img;
}

TEST(PlotPng, DecodesToExactlyTheImage) {
  ChartSpec spec;
  spec.width = 300;
  spec.height = 200;
  spec.lines.push_back({"up", {0, 1, 2, 3}, {0, 1, 4, 9}, {200, 30, 40}, 2.0});
  const std::vector<RgbImage> images = {test_image(37, 23), RgbImage(1, 1, {1, 2, 3}),
                                        noise_image(257, 131, 7), RgbImage(1, 300, {9, 8, 7}),
                                        render_chart(spec)};
  for (const RgbImage& img : images) {
    SCOPED_TRACE(std::to_string(img.width()) + "x" + std::to_string(img.height()));
    const Bytes png = encode_png(img);
    expect_png_of(png, img);
    EXPECT_EQ(encode_png(img), png);  // deterministic
  }
  // A flat chart compresses well; noise does not (and must still round-trip above).
  EXPECT_LT(encode_png(RgbImage(800, 480)).size(), 4000u);
}

TEST(PlotPng, TheDecoderCatchesDamage) {
  const RgbImage img = test_image(37, 23);
  const Bytes png = encode_png(img);
  ASSERT_NO_THROW(decode_png(png));
  Bytes bad = png;
  bad[bad.size() - 20] ^= 0x01;  // inside the IDAT chunk (IEND is the last 12 bytes)
  EXPECT_THROW(decode_png(bad), std::runtime_error);
  EXPECT_THROW(decode_png(Bytes(png.begin(), png.begin() + static_cast<std::ptrdiff_t>(png.size() / 2))),
               std::runtime_error);
  // A changed pixel is noticed by the comparison.
  RgbImage other = img;
  other.set(36, 22, {1, 1, 1});
  const DecodedPng d = decode_png(png);
  EXPECT_NE(d.rgb, other.pixels());
  EXPECT_EQ(d.rgb, img.pixels());
}

TEST(PlotPng, StreamsToASinkAndPassesOnItsErrors) {
  const RgbImage img = noise_image(120, 90, 3);
  Bytes streamed;
  size_t pieces = 0;
  encode_png(img, [&](std::span<const uint8_t> piece) {
    streamed.insert(streamed.end(), piece.begin(), piece.end());
    ++pieces;
  });
  EXPECT_GT(pieces, 1u);
  EXPECT_EQ(streamed, encode_png(img));

  // The sink's own exception comes out of encode_png unchanged, from the first piece or a later one.
  for (size_t fail_at : {size_t{0}, size_t{3}}) {
    size_t calls = 0;
    try {
      encode_png(img, [&](std::span<const uint8_t>) {
        if (calls++ == fail_at) throw std::length_error("sink is full");
      });
      ADD_FAILURE() << "no exception";
    } catch (const std::length_error& e) {
      EXPECT_STREQ(e.what(), "sink is full");
    }
    EXPECT_EQ(calls, fail_at + 1);  // libpng stopped at the failure
  }
  expect_png_of(encode_png(img), img);  // and encoding still works afterwards
}

TEST(PlotPng, WritePngReplacesTheFileWhole) {
  swarm::testing::ScratchDir dir("swarm-plot");
  const fs::path out = dir.path() / "chart.png";
  const RgbImage first = test_image(64, 48), second = noise_image(50, 40, 11);
  write_png(out, first);
  EXPECT_EQ(bytes_of_file(out), encode_png(first));
  write_png(out, second);  // over an existing file
  expect_png_of(bytes_of_file(out), second);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1u);  // no temporary file left beside it
}

TEST(PlotPng, WritePngFailuresThrowAndLeaveNothing) {
  swarm::testing::ScratchDir dir("swarm-plot");
  const RgbImage img = test_image(20, 10);
  auto expect_write_error = [&](const fs::path& path) {
    try {
      write_png(path, img);
      ADD_FAILURE() << "no error writing " << path;
    } catch (const SwarmError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find("cannot write " + path.string() + ": "), std::string::npos)
          << e.what();
    }
  };
  expect_write_error(dir.path() / "missing" / "chart.png");  // no such directory
  fs::create_directory(dir.path() / "taken");
  std::ofstream(dir.path() / "taken" / "keep") << "x";
  expect_write_error(dir.path() / "taken");  // the rename cannot replace a directory
  EXPECT_TRUE(fs::is_directory(dir.path() / "taken"));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path())) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"taken"});  // the temporary file is gone
}

TEST(PlotFont, TextLandsInItsBox) {
  EXPECT_EQ(text_width("", 1), 0);
  EXPECT_EQ(text_width("A", 1), 5);
  EXPECT_EQ(text_width("AB", 2), 22);
  EXPECT_EQ(glyph_count("a\xC3\xA9z"), 3);  // one UTF-8 sequence, one '?'
  EXPECT_EQ(glyph_rows('\x01'), glyph_rows('?'));

  RgbImage img(40, 20);
  const Rgb ink{0, 0, 0};
  draw_text(img, 3, 4, "T1", ink);
  int inked = 0;
  for (int y = 0; y < 20; ++y)
    for (int x = 0; x < 40; ++x)
      if (img.at(x, y) == ink) {
        ++inked;
        EXPECT_TRUE(x >= 3 && x < 3 + text_width("T1") && y >= 4 && y < 4 + kGlyphHeight) << x << "," << y;
      }
  EXPECT_EQ(inked, (5 + 6) + (1 + 2 + 1 + 1 + 1 + 1 + 3));  // T: bar and stem; 1: flag, stem, foot
  EXPECT_EQ(img.at(3, 4), ink);                             // T's bar starts top left
  EXPECT_EQ(img.at(5, 10), ink);                            // T's stem reaches the bottom row

  RgbImage g(10, 12);
  draw_text(g, 0, 0, "g", ink);  // the tail hangs below the baseline (row 6)
  EXPECT_EQ(g.at(1, 8), ink);
  EXPECT_NE(g.at(1, 0), ink);

  RgbImage v(20, 40);
  draw_text_vertical(v, 2, 30, "T", ink);  // turned: the bar runs up the left column
  for (int y = 26; y <= 30; ++y) EXPECT_EQ(v.at(2, y), ink) << y;
  for (int x = 2; x <= 8; ++x) EXPECT_EQ(v.at(x, 28), ink) << x;  // the stem goes right
}

TEST(PlotChart, AxesAndTickLabels) {
  Axis a = make_axis(0.12, 0.87, 6, false);
  EXPECT_DOUBLE_EQ(a.step, 0.2);
  EXPECT_DOUBLE_EQ(a.min, 0.12);  // the range is kept, the ticks fall inside it
  EXPECT_DOUBLE_EQ(a.max, 0.87);
  ASSERT_EQ(a.ticks.size(), 4u);
  EXPECT_NEAR(a.ticks.front(), 0.2, 1e-12);
  EXPECT_NEAR(a.ticks.back(), 0.8, 1e-12);
  a = make_axis(0, 1.1, 5, false);
  EXPECT_DOUBLE_EQ(a.step, 0.25);
  a = make_axis(1, 3, 8, true);
  EXPECT_DOUBLE_EQ(a.step, 1.0);
  EXPECT_EQ(a.ticks, (std::vector<double>{1, 2, 3}));
  a = make_axis(1, 120, 7, true);
  EXPECT_DOUBLE_EQ(a.step, 20.0);
  EXPECT_EQ(a.ticks, (std::vector<double>{20, 40, 60, 80, 100, 120}));
  // Integer steps never get a 2.5 spacing (1..25 over 10 ticks asks for 2.4 -> 2.5).
  a = make_axis(1, 25, 10, true);
  EXPECT_DOUBLE_EQ(a.step, 5.0);
  for (double t : a.ticks) EXPECT_EQ(t, std::floor(t));
  for (int target : {3, 5, 8, 10, 12})
    for (double hi : {4.0, 7.0, 25.0, 26.0, 250.0, 2600.0})
      for (double t : make_axis(1, hi, target, true).ticks)
        EXPECT_EQ(t, std::floor(t)) << hi << " " << target;
  a = make_axis(5, 5, 5, false);  // constant series: widened, still around the value
  EXPECT_LT(a.min, 5.0);
  EXPECT_GT(a.max, 5.0);
  for (int target : {2, 3, 7})
    for (double hi : {0.011, 0.29, 1.0, 7.3, 999.0})
      EXPECT_FALSE(make_axis(0.01, hi, target, false).ticks.empty());
  EXPECT_EQ(format_tick(0.2, 0.2), "0.2");
  EXPECT_EQ(format_tick(0.25, 0.05), "0.25");
  EXPECT_EQ(format_tick(0.5, 0.25), "0.50");
  EXPECT_EQ(format_tick(-1e-17, 0.1), "0.0");
  EXPECT_EQ(format_tick(120, 20), "120");
  EXPECT_EQ(format_tick(2e7, 5e6), "2e+07");
}

TEST(PlotChart, RisingSeriesRisesLeftToRight) {
  MetricSeries s;
  s.field = "reward_mean";
  for (int i = 1; i <= 60; ++i) {  // rising, with a zigzag so the raw line shows beside the average
    s.steps.push_back(i);
    s.values.push_back(0.1 + 0.8 * i / 60.0 + (i % 2 ? 0.04 : -0.04));
  }
  RewardChartOptions opt;
  opt.title = "rising";
  const ChartSpec spec = build_reward_chart(s, opt);
  ASSERT_EQ(spec.lines.size(), 2u);  // raw + moving average
  const Rgb raw = spec.lines[0].color;
  ChartLayout L;
  const RgbImage img = render_chart(spec, &L);
  EXPECT_EQ(img.width(), 800);
  EXPECT_EQ(img.height(), 480);

  // Mean row of the raw line's pixels in the left and the right fifth of the plot.
  const int fifth = (L.right - L.left) / 5;
  auto mean_row = [&](int x0, int x1) {
    double sum = 0;
    int n = 0;
    for (int y = L.top + 1; y < L.bottom; ++y)
      for (int x = x0; x < x1; ++x)
        if (img.at(x, y) == raw &&
            !(x >= L.legend_left && x <= L.legend_right && y >= L.legend_top && y <= L.legend_bottom))
          sum += y, ++n;
    EXPECT_GT(n, 0) << "no line pixels in columns " << x0 << ".." << x1;
    return n ? sum / n : 0.0;
  };
  const double left_row = mean_row(L.left + 1, L.left + fifth),
               right_row = mean_row(L.right - fifth, L.right);
  EXPECT_GT(left_row, right_row + 0.5 * (L.bottom - L.top));  // rows grow downwards

  // The curve goes through its data points, and the legend does not sit on either end.
  for (size_t i : {size_t{0}, size_t{59}}) {
    const int px = static_cast<int>(L.to_px_x(s.steps[i])), py = static_cast<int>(L.to_px_y(s.values[i]));
    bool near = false;
    for (int dy = -2; dy <= 2; ++dy)
      for (int dx = -2; dx <= 2; ++dx)
        near |= img.contains(px + dx, py + dy) && img.at(px + dx, py + dy) != Rgb{255, 255, 255};
    EXPECT_TRUE(near) << "point " << i;
    EXPECT_FALSE(px >= L.legend_left && px <= L.legend_right && py >= L.legend_top && py <= L.legend_bottom);
  }
  EXPECT_GT(L.legend_right, L.legend_left);
  EXPECT_DOUBLE_EQ(L.x.min, 1.0);  // the x axis spans the steps exactly
  EXPECT_DOUBLE_EQ(L.x.max, 60.0);
}

TEST(PlotChart, RejectsEmptyAndTinyCharts) {
  ChartSpec spec;
  EXPECT_THROW(render_chart(spec), std::invalid_argument);
  spec.lines.push_back({"nan", {1}, {NAN}, {0, 0, 0}, 2.0});
  EXPECT_THROW(render_chart(spec), std::invalid_argument);
  spec.lines[0].y = {1.0};
  EXPECT_NO_THROW(render_chart(spec));  // one point: a dot
  spec.width = 100;
  EXPECT_THROW(render_chart(spec), std::invalid_argument);
}

TEST(PlotMetrics, ParsesStepsBandsAndSkipsBadLines) {
  std::istringstream in(
      "{\"step\":2,\"reward_mean\":0.5,\"reward_std\":0.1}\n"
      "not json\n"
      "\n"
      "{\"step\":1,\"reward_mean\":0.25}\n"
      "[1,2]\n"
      "{\"reward_mean\":0.9}\n"
      "{\"step\":3,\"reward_mean\":null,\"reward_std\":0.2}\n"
      "{\"global_step\":4,\"reward_mean\":0.75,\"reward_std\":0.05}\n"
      "{\"step\":2,\"reward_mean\":0.6,\"reward_std\":0.1}\n"
      "{\"step\":5,\"reward_mean\":0.8,\"reward");  // cut mid-write
  const MetricSeries s = parse_metric_series(in, "reward_mean", "test");
  EXPECT_EQ(s.steps, (std::vector<double>{1, 2, 4}));
  EXPECT_EQ(s.values, (std::vector<double>{0.25, 0.6, 0.75}));  // step 2: the later line
  EXPECT_EQ(s.std_field, "reward_std");
  ASSERT_EQ(s.stds.size(), 3u);
  EXPECT_TRUE(std::isnan(s.stds[0]));
  EXPECT_DOUBLE_EQ(s.stds[2], 0.05);
  EXPECT_EQ(s.lines, 9u);
  EXPECT_EQ(s.malformed, 4u);  // "not json", [1,2], no step, the cut line
  EXPECT_EQ(s.without_value, 1u);
  EXPECT_EQ(s.duplicates, 1u);
  EXPECT_EQ(summarize(s),
            "reward_mean: 3 steps (1..4), first 0.25, last 0.75, min 0.25 at step 1, max 0.75 at step 4");

  const ChartSpec spec = build_reward_chart(s, {});
  ASSERT_EQ(spec.bands.size(), 1u);
  EXPECT_EQ(spec.bands[0].x, (std::vector<double>{2, 4}));  // only points with a std
  EXPECT_TRUE(spec.integer_x);
}

// A reward in [0, 1] has its band clipped there; any other field keeps mean +/- std.
TEST(PlotMetrics, AUnitRewardBandStaysWithinZeroAndOne) {
  std::istringstream in(
      "{\"step\":1,\"reward_mean\":0.9,\"reward_std\":0.3}\n{\"step\":2,\"reward_mean\":0.1,\"reward_std\":0."
      "3}\n");
  const ChartSpec spec = build_reward_chart(parse_metric_series(in, "reward_mean", "t"), {});
  ASSERT_EQ(spec.bands.size(), 1u);
  EXPECT_DOUBLE_EQ(spec.bands[0].hi[0], 1.0);
  EXPECT_DOUBLE_EQ(spec.bands[0].lo[0], 0.6);
  EXPECT_DOUBLE_EQ(spec.bands[0].lo[1], 0.0);
  EXPECT_DOUBLE_EQ(spec.bands[0].hi[1], 0.4);
  std::istringstream other("{\"step\":1,\"loss_mean\":0.9,\"loss_std\":0.3}\n");
  const ChartSpec unclipped = build_reward_chart(parse_metric_series(other, "loss_mean", "t"), {});
  EXPECT_DOUBLE_EQ(unclipped.bands[0].hi[0], 1.2);
  std::istringstream wide("{\"step\":1,\"reward_mean\":2.0,\"reward_std\":0.5}\n");
  EXPECT_DOUBLE_EQ(build_reward_chart(parse_metric_series(wide, "reward_mean", "t"), {}).bands[0].hi[0], 2.5);
}

// What agents send as log_metrics is nested in metrics.jsonl; the plot reaches it by a dotted name.
TEST(PlotMetrics, LogMetricsByADottedName) {
  const std::string text =
      "{\"step\":1,\"reward_mean\":0.5,\"log_metrics\":{\"turns\":{\"mean\":3,\"min\":1,\"max\":5,"
      "\"episodes\":4}}}\n"
      "{\"step\":2,\"reward_mean\":0.5}\n"
      "{\"step\":3,\"reward_mean\":0.5,\"log_metrics\":{\"turns\":{\"mean\":2,\"min\":2,\"max\":2,"
      "\"episodes\":4}}}\n";
  std::istringstream a(text), b(text), c(text), d(text);
  const MetricSeries mean = parse_metric_series(a, "log_metrics.turns", "t");
  EXPECT_EQ(mean.steps, (std::vector<double>{1, 3}));
  EXPECT_EQ(mean.values, (std::vector<double>{3, 2}));
  EXPECT_EQ(mean.without_value, 1u);
  EXPECT_EQ(parse_metric_series(b, "log_metrics.turns.max", "t").values, (std::vector<double>{5, 2}));
  EXPECT_EQ(parse_metric_series(c, "log_metrics.turns.min", "t").values, (std::vector<double>{1, 2}));
  try {
    parse_metric_series(d, "log_metrics.tunrs", "t");
    FAIL() << "an unknown log metric was accepted";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("log_metrics.turns.mean"), std::string::npos) << e.what();
  }
}

// swarm-plot with several --metrics: one coloured line per series, each with its own band,
// labelled as asked (the SAPO experiment's splits on one chart).
TEST(PlotMetrics, ComparisonChartHasALineAndBandPerSeries) {
  std::istringstream a(
      "{\"step\":1,\"reward_mean\":0.2,\"reward_std\":0.1}\n{\"step\":2,\"reward_mean\":0.4,\"reward_std\":0."
      "1}\n");
  std::istringstream b("{\"step\":1,\"reward_mean\":0.3}\n{\"step\":2,\"reward_mean\":0.7}\n");
  const std::vector<MetricSeries> series = {parse_metric_series(a, "reward_mean", "a"),
                                            parse_metric_series(b, "reward_mean", "b")};
  RewardChartOptions opt;
  opt.title = "splits";
  const ChartSpec spec = build_comparison_chart(series, {"8/0", "4/4"}, opt);
  ASSERT_EQ(spec.lines.size(), 2u);
  EXPECT_EQ(spec.lines[0].label, "8/0");
  EXPECT_EQ(spec.lines[1].label, "4/4");
  EXPECT_EQ(spec.lines[1].y, (std::vector<double>{0.3, 0.7}));
  EXPECT_FALSE(spec.lines[0].color == spec.lines[1].color);
  ASSERT_EQ(spec.bands.size(), 1u);  // only the series with a std
  ASSERT_EQ(spec.bands[0].hi.size(), 2u);
  EXPECT_DOUBLE_EQ(spec.bands[0].hi[1], 0.5);
  const RgbImage image = render_chart(spec);
  EXPECT_EQ(image.width(), 800);
  EXPECT_THROW(build_comparison_chart({}, {}, opt), SwarmError);
  EXPECT_THROW(build_comparison_chart(std::vector<MetricSeries>(9, series[0]), {}, opt), SwarmError);
}

TEST(PlotMetrics, ErrorsNameTheProblem) {
  auto error_of = [](const std::string& text, const std::string& field) -> std::string {
    std::istringstream in(text);
    try {
      parse_metric_series(in, field, "m.jsonl");
    } catch (const SwarmError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(error_of("{\"step\":1,\"loss\":0.1,\"reward_mean\":0.2}\n", "rewrd"),
            "unknown field 'rewrd' in m.jsonl (fields: loss, reward_mean, step)");
  EXPECT_EQ(error_of("", "reward_mean"), "no usable points in m.jsonl: it is empty");
  EXPECT_EQ(error_of("x\ny\n", "reward_mean"),
            "no usable points in m.jsonl: 2 malformed line(s), none usable");
  EXPECT_EQ(error_of("{\"step\":1,\"kl\":null}\n", "kl"),
            "no usable points in m.jsonl: 'kl' is never a finite number");
  try {
    load_metric_series("/nonexistent/metrics.jsonl", "reward_mean");
    FAIL() << "no error";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NOT_FOUND);
  }
}

TEST(PlotMetrics, MovingAverageAndTitle) {
  EXPECT_EQ(moving_average({1, 2, 3, 4, 5}, 3), (std::vector<double>{1.5, 2, 3, 4, 4.5}));
  EXPECT_EQ(moving_average({0, 3, 0, 3, 0}, 3), (std::vector<double>{1.5, 1, 2, 1, 1.5}));
  EXPECT_EQ(moving_average({2, 4, 6, 8}, 4), (std::vector<double>{4, 5, 5, 6}));  // 4 -> 5 wide
  EXPECT_EQ(moving_average({4, 8}, 1), (std::vector<double>{4, 8}));
  EXPECT_EQ(default_window(3), 1u);
  EXPECT_EQ(default_window(100), 10u);
  EXPECT_EQ(default_title("/x/experiments/echo/echo-agent/metrics.jsonl", "reward_mean"),
            "reward_mean: echo/echo-agent");
}

// ---- the swarm-plot binary

struct ToolRun {
  int rc;
  std::string output;  // stdout and stderr
};

ToolRun run_tool(const std::string& args) {
  const std::string cmd = std::string("'") + SWARM_PLOT_BIN + "' " + args + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(PlotTool, WritesThePngAndSummarizes) {
  swarm::testing::ScratchDir dir("swarm-plot");
  const fs::path run = dir.path() / "proj" / "exp";
  fs::create_directories(run);
  {
    std::ofstream m(run / "metrics.jsonl");
    for (int i = 1; i <= 30; ++i)
      m << "{\"step\":" << i << ",\"reward_mean\":" << 0.02 * i << ",\"reward_std\":0.05}\n";
    m << "{\"step\":31,\"reward_me\n";
  }
  const fs::path out = dir.path() / "reward.png";
  const ToolRun r =
      run_tool("--metrics '" + run.string() + "' --out '" + out.string() + "' --width 400 --height 300");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("warning: skipped 1 malformed line(s) of 31"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("wrote " + out.string() + " (400x300"), std::string::npos) << r.output;
  EXPECT_NE(
      r.output.find(
          "reward_mean: 30 steps (1..30), first 0.02, last 0.6, min 0.02 at step 1, max 0.6 at step 30"),
      std::string::npos)
      << r.output;
  // The file holds exactly the chart the library draws for these options.
  RewardChartOptions options;
  options.title = default_title(run.string(), "reward_mean");
  options.width = 400;
  options.height = 300;
  const RgbImage expected = render_chart(build_reward_chart(load_metric_series(run, "reward_mean"), options));
  expect_png_of(bytes_of_file(out), expected);
}

TEST(PlotTool, ErrorCasesExitTwo) {
  swarm::testing::ScratchDir dir("swarm-plot");
  const fs::path m = dir.path() / "metrics.jsonl", out = dir.path() / "r.png";
  std::ofstream(m) << "{\"step\":1,\"reward_mean\":0.5}\n{\"step\":2,\"reward_mean\":null}\n";
  const std::string o = " --out '" + out.string() + "'";

  ToolRun r = run_tool("--metrics '" + (dir.path() / "missing.jsonl").string() + "'" + o);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("does not exist"), std::string::npos) << r.output;

  r = run_tool("--metrics '" + m.string() + "' --field nope" + o);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("unknown field 'nope'"), std::string::npos) << r.output;

  std::ofstream(dir.path() / "junk.jsonl") << "garbage\n{\"no_step\":1}\n";
  r = run_tool("--metrics '" + (dir.path() / "junk.jsonl").string() + "'" + o);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("no usable points"), std::string::npos) << r.output;

  r = run_tool("--metrics '" + m.string() + "' --width 10" + o);  // a usage error
  EXPECT_EQ(r.rc, 2) << r.output;
  r = run_tool(o);  // --metrics is required
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_FALSE(fs::exists(out));

  r = run_tool("--metrics '" + m.string() + "'" + o);  // one usable point still plots
  EXPECT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("1 line(s) without a finite 'reward_mean'"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace swarm::plot
