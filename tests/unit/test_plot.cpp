// swarm-plot: the PNG encoder (checked by an inflater written here and by Python's zlib),
// the bitmap font, the chart layout, metrics parsing, and the tool's exit codes.
#include <gtest/gtest.h>
#include <sys/wait.h>

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

Bytes bytes_of(const std::string& s) { return Bytes(s.begin(), s.end()); }

uint32_t be32(const Bytes& b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) | b[at + 3];
}

// An independent inflater for what the encoder may emit: stored and fixed-Huffman blocks
// (RFC 1951 3.2.4 and 3.2.6). Dynamic blocks are refused.
class Inflater {
 public:
  explicit Inflater(const Bytes& in, size_t start) : in_(in), bit_(start * 8) {}

  Bytes run() {
    Bytes out;
    bool final = false;
    while (!final) {
      final = bits(1) == 1;
      const uint32_t type = bits(2);
      if (type == 0) {
        bit_ = (bit_ + 7) / 8 * 8;
        const uint32_t len = bits(16), nlen = bits(16);
        if ((len ^ 0xFFFF) != nlen) throw std::runtime_error("stored block: LEN/NLEN mismatch");
        for (uint32_t i = 0; i < len; ++i) out.push_back(static_cast<uint8_t>(bits(8)));
      } else if (type == 1) {
        for (;;) {
          const int sym = fixed_symbol();
          if (sym < 256) {
            out.push_back(static_cast<uint8_t>(sym));
          } else if (sym == 256) {
            break;
          } else {
            static const int kLen[] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                       31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
            static const int kLenExtra[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                            2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
            static const int kDist[] = {1,    2,    3,    4,    5,    7,    9,    13,    17,    25,
                                        33,   49,   65,   97,   129,  193,  257,  385,   513,   769,
                                        1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
            static const int kDistExtra[] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                             6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
            const int li = sym - 257;
            if (li > 28) throw std::runtime_error("bad length symbol");
            const size_t len = static_cast<size_t>(kLen[li]) + bits(kLenExtra[li]);
            uint32_t dcode = 0;
            for (int i = 0; i < 5; ++i) dcode = (dcode << 1) | bits(1);
            if (dcode > 29) throw std::runtime_error("bad distance symbol");
            const size_t dist = static_cast<size_t>(kDist[dcode]) + bits(kDistExtra[dcode]);
            if (dist > out.size()) throw std::runtime_error("distance before the start");
            for (size_t i = 0; i < len; ++i) out.push_back(out[out.size() - dist]);
          }
        }
      } else {
        throw std::runtime_error("unexpected block type " + std::to_string(type));
      }
    }
    end_byte_ = (bit_ + 7) / 8;
    return out;
  }
  size_t end_byte() const { return end_byte_; }

 private:
  uint32_t bits(int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i, ++bit_) {
      if (bit_ / 8 >= in_.size()) throw std::runtime_error("ran past the end of the stream");
      v |= ((in_[bit_ / 8] >> (bit_ % 8)) & 1u) << i;
    }
    return v;
  }
  int fixed_symbol() {
    uint32_t code = 0;
    for (int len = 1; len <= 9; ++len) {
      code = (code << 1) | bits(1);
      if (len == 7 && code <= 23) return 256 + static_cast<int>(code);
      if (len == 8 && code >= 0x30 && code <= 0xBF) return static_cast<int>(code - 0x30);
      if (len == 8 && code >= 0xC0 && code <= 0xC7) return 280 + static_cast<int>(code - 0xC0);
      if (len == 9 && code >= 0x190) return 144 + static_cast<int>(code - 0x190);
    }
    throw std::runtime_error("bad literal/length code");
  }

  const Bytes& in_;
  size_t bit_;
  size_t end_byte_ = 0;
};

// zlib header, deflate data, Adler-32 trailer.
Bytes zlib_decode(const Bytes& z) {
  if (z.size() < 6) throw std::runtime_error("zlib stream too short");
  if ((z[0] & 0x0F) != 8 || (z[0] * 256 + z[1]) % 31 != 0 || (z[1] & 0x20)) throw std::runtime_error("bad zlib header");
  Inflater inf(z, 2);
  Bytes out = inf.run();
  if (inf.end_byte() + 4 != z.size()) throw std::runtime_error("trailing bytes after the deflate stream");
  if (be32(z, inf.end_byte()) != adler32(out)) throw std::runtime_error("Adler-32 mismatch");
  return out;
}

struct PngChunk {
  std::string type;
  Bytes data;
};

// Splits a PNG into chunks, checking the signature and every CRC.
std::vector<PngChunk> png_chunks(const Bytes& png) {
  const Bytes sig = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (png.size() < 8 || !std::equal(sig.begin(), sig.end(), png.begin())) throw std::runtime_error("bad signature");
  std::vector<PngChunk> chunks;
  size_t at = 8;
  while (at < png.size()) {
    if (at + 12 > png.size()) throw std::runtime_error("truncated chunk");
    const uint32_t len = be32(png, at);
    if (at + 12 + len > png.size()) throw std::runtime_error("chunk longer than the file");
    const std::span<const uint8_t> typed(png.data() + at + 4, 4 + len);
    if (crc32(typed) != be32(png, at + 8 + len)) throw std::runtime_error("chunk CRC mismatch");
    chunks.push_back({std::string(png.begin() + at + 4, png.begin() + at + 8),
                      Bytes(png.begin() + at + 8, png.begin() + at + 8 + len)});
    at += 12 + len;
  }
  return chunks;
}

// A test image: gradient plus a few flat areas, so both literals and matches occur.
RgbImage test_image(int w, int h) {
  RgbImage img(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      img.set(x, y, {static_cast<uint8_t>(x * 7), static_cast<uint8_t>(y * 5), static_cast<uint8_t>((x ^ y) & 0xF0)});
  img.fill_rect(2, 2, w / 2, h / 2, {255, 255, 255});
  return img;
}

TEST(PlotChecksums, KnownVectors) {
  EXPECT_EQ(crc32(bytes_of("123456789")), 0xCBF43926u);
  EXPECT_EQ(crc32(bytes_of("")), 0u);
  EXPECT_EQ(crc32(bytes_of("6789"), crc32(bytes_of("12345"))), 0xCBF43926u);  // running
  EXPECT_EQ(adler32(bytes_of("Wikipedia")), 0x11E60398u);
  EXPECT_EQ(adler32(bytes_of("")), 1u);
  Bytes big(100000, 0xFF);  // past the 5552-byte overflow block
  uint32_t a = 1, b = 0;
  for (uint8_t c : big) a = (a + c) % 65521, b = (b + a) % 65521;
  EXPECT_EQ(adler32(big), (b << 16) | a);
}

TEST(PlotZlib, RoundTripsEveryKindOfInput) {
  std::mt19937 rng(7);
  std::vector<Bytes> inputs = {{}, {42}, bytes_of("abcabcabcabcabcabcabc"), Bytes(70000, 0)};
  Bytes random(5000), mixed;
  for (auto& c : random) c = static_cast<uint8_t>(rng());
  inputs.push_back(random);
  for (int i = 0; i < 40000; ++i) mixed.push_back(static_cast<uint8_t>(i % 7 == 0 ? rng() : (i / 300) % 256));
  inputs.push_back(mixed);
  for (const Bytes& in : inputs) {
    const Bytes z = zlib_compress(in);
    EXPECT_EQ(zlib_decode(z), in) << "input of " << in.size() << " bytes";
  }
  EXPECT_LT(zlib_compress(Bytes(70000, 0)).size(), 2000u);  // long runs do compress
}

TEST(PlotPng, ValidFileWithTheImageInIt) {
  const RgbImage img = test_image(37, 23);
  const Bytes png = encode_png(img);
  const auto chunks = png_chunks(png);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].type, "IHDR");
  EXPECT_EQ(chunks[1].type, "IDAT");
  EXPECT_EQ(chunks[2].type, "IEND");
  EXPECT_TRUE(chunks[2].data.empty());
  const Bytes& ihdr = chunks[0].data;
  ASSERT_EQ(ihdr.size(), 13u);
  EXPECT_EQ(be32(ihdr, 0), 37u);  // width
  EXPECT_EQ(be32(ihdr, 4), 23u);  // height
  EXPECT_EQ(ihdr[8], 8);          // bit depth
  EXPECT_EQ(ihdr[9], 2);          // truecolour RGB
  EXPECT_EQ(ihdr[10], 0);         // deflate
  EXPECT_EQ(ihdr[11], 0);         // filter method
  EXPECT_EQ(ihdr[12], 0);         // no interlace
  const Bytes raw = zlib_decode(chunks[1].data);
  ASSERT_EQ(raw.size(), 23u * (37u * 3u + 1u));
  for (int y = 0; y < 23; ++y) {
    const size_t row = static_cast<size_t>(y) * (37 * 3 + 1);
    ASSERT_EQ(raw[row], 0) << "filter byte of row " << y;
    for (int x = 0; x < 37; ++x) {
      const Rgb c = img.at(x, y);
      const size_t p = row + 1 + static_cast<size_t>(x) * 3;
      ASSERT_EQ((Rgb{raw[p], raw[p + 1], raw[p + 2]}), c) << "pixel " << x << "," << y;
    }
  }
  // A corrupted byte is caught by the chunk CRC.
  Bytes bad = png;
  bad[40] ^= 0x01;
  EXPECT_THROW(png_chunks(bad), std::runtime_error);
}

TEST(PlotPng, PythonZlibDecodesTheChart) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  swarm::testing::ScratchDir dir("swarm-plot");
  ChartSpec spec;
  spec.width = 300;
  spec.height = 200;
  spec.lines.push_back({"up", {0, 1, 2, 3}, {0, 1, 4, 9}, {200, 30, 40}, 2.0});
  const RgbImage img = render_chart(spec);
  const auto chunks = png_chunks(encode_png(img));
  const fs::path z = dir.path() / "idat.z", raw = dir.path() / "raw.bin";
  std::ofstream(z, std::ios::binary)
      .write(reinterpret_cast<const char*>(chunks[1].data.data()), static_cast<std::streamsize>(chunks[1].data.size()));
  const std::string cmd =
      "/usr/bin/python3 -c \"import sys, zlib; open(sys.argv[2], 'wb').write("
      "zlib.decompress(open(sys.argv[1], 'rb').read()))\" '" +
      z.string() + "' '" + raw.string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::string got = swarm::testing::read_file(raw);
  ASSERT_EQ(got.size(), 200u * (300u * 3u + 1u));
  bool line_colour = false;
  for (size_t y = 0; y < 200 && !line_colour; ++y)
    for (size_t x = 0; x < 300; ++x) {
      const size_t p = y * (300 * 3 + 1) + 1 + x * 3;
      if (static_cast<uint8_t>(got[p]) == 200 && static_cast<uint8_t>(got[p + 1]) == 30 &&
          static_cast<uint8_t>(got[p + 2]) == 40) {
        line_colour = true;
        break;
      }
    }
  EXPECT_TRUE(line_colour);
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
  a = make_axis(5, 5, 5, false);  // constant series: widened, still around the value
  EXPECT_LT(a.min, 5.0);
  EXPECT_GT(a.max, 5.0);
  for (int target : {2, 3, 7})
    for (double hi : {0.011, 0.29, 1.0, 7.3, 999.0}) EXPECT_FALSE(make_axis(0.01, hi, target, false).ticks.empty());
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
  const double left_row = mean_row(L.left + 1, L.left + fifth), right_row = mean_row(L.right - fifth, L.right);
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
  EXPECT_EQ(summarize(s), "reward_mean: 3 steps (1..4), first 0.25, last 0.75, min 0.25 at step 1, max 0.75 at step 4");

  const ChartSpec spec = build_reward_chart(s, {});
  ASSERT_EQ(spec.bands.size(), 1u);
  EXPECT_EQ(spec.bands[0].x, (std::vector<double>{2, 4}));  // only points with a std
  EXPECT_TRUE(spec.integer_x);
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
  EXPECT_EQ(error_of("x\ny\n", "reward_mean"), "no usable points in m.jsonl: 2 malformed line(s), none usable");
  EXPECT_EQ(error_of("{\"step\":1,\"kl\":null}\n", "kl"), "no usable points in m.jsonl: 'kl' is never a finite number");
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
  const ToolRun r = run_tool("--metrics '" + run.string() + "' --out '" + out.string() + "' --width 400 --height 300");
  ASSERT_EQ(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("warning: skipped 1 malformed line(s) of 31"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("wrote " + out.string() + " (400x300"), std::string::npos) << r.output;
  EXPECT_NE(
      r.output.find("reward_mean: 30 steps (1..30), first 0.02, last 0.6, min 0.02 at step 1, max 0.6 at step 30"),
      std::string::npos)
      << r.output;
  const std::string png = swarm::testing::read_file(out);
  const auto chunks = png_chunks(Bytes(png.begin(), png.end()));
  EXPECT_EQ(be32(chunks[0].data, 0), 400u);
  EXPECT_EQ(zlib_decode(chunks[1].data).size(), 300u * (400u * 3u + 1u));
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
