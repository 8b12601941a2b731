#include "plot/png_writer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <string>
#include <string_view>

#include "common/error.hpp"

namespace swarm::plot {
namespace {

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

// Deflate writes bits least-significant first; Huffman codes go most-significant bit first,
// so they are reversed before being put.
class BitWriter {
 public:
  explicit BitWriter(std::vector<uint8_t>& out) : out_(out) {}

  void put(uint32_t bits, int count) {
    acc_ |= static_cast<uint64_t>(bits) << count_;
    count_ += count;
    while (count_ >= 8) {
      out_.push_back(static_cast<uint8_t>(acc_ & 0xFF));
      acc_ >>= 8;
      count_ -= 8;
    }
  }
  void put_code(uint32_t code, int length) {
    uint32_t reversed = 0;
    for (int i = 0; i < length; ++i) reversed |= ((code >> i) & 1u) << (length - 1 - i);
    put(reversed, length);
  }
  void flush() {
    if (count_ > 0) out_.push_back(static_cast<uint8_t>(acc_ & 0xFF));
    acc_ = 0;
    count_ = 0;
  }

 private:
  std::vector<uint8_t>& out_;
  uint64_t acc_ = 0;
  int count_ = 0;
};

// The fixed literal/length code of RFC 1951 section 3.2.6.
void put_symbol(BitWriter& w, int symbol) {
  if (symbol <= 143) {
    w.put_code(0x30 + symbol, 8);
  } else if (symbol <= 255) {
    w.put_code(0x190 + (symbol - 144), 9);
  } else if (symbol <= 279) {
    w.put_code(symbol - 256, 7);
  } else {
    w.put_code(0xC0 + (symbol - 280), 8);
  }
}

constexpr uint16_t kLengthBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                      31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr uint8_t kLengthExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                      2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr uint16_t kDistanceBase[30] = {1,    2,    3,    4,    5,    7,    9,    13,    17,    25,
                                        33,   49,   65,   97,   129,  193,  257,  385,   513,   769,
                                        1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr uint8_t kDistanceExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                        6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

void put_match(BitWriter& w, int length, int distance) {
  int li = 28;
  while (kLengthBase[li] > length) --li;
  put_symbol(w, 257 + li);
  w.put(static_cast<uint32_t>(length - kLengthBase[li]), kLengthExtra[li]);
  int di = 29;
  while (kDistanceBase[di] > distance) --di;
  w.put_code(static_cast<uint32_t>(di), 5);  // fixed distance codes: 5 bits each
  w.put(static_cast<uint32_t>(distance - kDistanceBase[di]), kDistanceExtra[di]);
}

void deflate_fixed(std::span<const uint8_t> data, std::vector<uint8_t>& out) {
  constexpr size_t kWindow = 32768, kMinMatch = 3, kMaxMatch = 258;
  constexpr int kHashBits = 15, kMaxChain = 48;
  const size_t n = data.size();
  std::vector<int64_t> head(size_t{1} << kHashBits, -1), prev(kWindow, -1);
  auto hash = [&](size_t i) {
    const uint32_t v = data[i] | (uint32_t{data[i + 1]} << 8) | (uint32_t{data[i + 2]} << 16);
    return (v * 2654435761u) >> (32 - kHashBits);
  };
  auto insert = [&](size_t i) {
    if (i + kMinMatch > n) return;
    const uint32_t h = hash(i);
    prev[i & (kWindow - 1)] = head[h];
    head[h] = static_cast<int64_t>(i);
  };

  BitWriter w(out);
  w.put(1, 1);  // BFINAL: the only block
  w.put(1, 2);  // BTYPE 01: fixed Huffman codes
  size_t i = 0;
  while (i < n) {
    size_t best_len = 0, best_dist = 0;
    if (i + kMinMatch <= n) {
      const size_t max_len = std::min(kMaxMatch, n - i);
      int64_t cand = head[hash(i)];
      for (int chain = kMaxChain; cand >= 0 && i - static_cast<size_t>(cand) <= kWindow && chain > 0; --chain) {
        const size_t c = static_cast<size_t>(cand);
        if (data[c + best_len] == data[i + best_len]) {
          size_t len = 0;
          while (len < max_len && data[c + len] == data[i + len]) ++len;
          if (len > best_len) {
            best_len = len;
            best_dist = i - c;
            if (len == max_len) break;
          }
        }
        const int64_t next = prev[c & (kWindow - 1)];
        if (next >= cand) break;  // the slot was reused: the chain ends here
        cand = next;
      }
    }
    if (best_len >= kMinMatch) {
      put_match(w, static_cast<int>(best_len), static_cast<int>(best_dist));
      for (size_t k = 0; k < best_len; ++k) insert(i + k);
      i += best_len;
    } else {
      put_symbol(w, data[i]);
      insert(i);
      ++i;
    }
  }
  put_symbol(w, 256);  // end of block
  w.flush();
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

void put_chunk(std::vector<uint8_t>& out, std::string_view type, std::span<const uint8_t> payload) {
  put_u32(out, static_cast<uint32_t>(payload.size()));
  const size_t type_at = out.size();
  out.insert(out.end(), type.begin(), type.end());
  out.insert(out.end(), payload.begin(), payload.end());
  // The CRC covers the chunk type and the data, not the length.
  put_u32(out, crc32(std::span<const uint8_t>(out.data() + type_at, out.size() - type_at)));
}

}  // namespace

uint32_t crc32(std::span<const uint8_t> data, uint32_t crc) {
  uint32_t c = crc ^ 0xFFFFFFFFu;
  for (uint8_t b : data) c = kCrcTable[(c ^ b) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t adler32(std::span<const uint8_t> data, uint32_t adler) {
  constexpr uint32_t kMod = 65521;
  constexpr size_t kBlock = 5552;  // the most bytes before the sums can overflow 32 bits
  uint32_t a = adler & 0xFFFF, b = adler >> 16;
  for (size_t at = 0; at < data.size(); at += kBlock) {
    const size_t end = std::min(data.size(), at + kBlock);
    for (size_t i = at; i < end; ++i) {
      a += data[i];
      b += a;
    }
    a %= kMod;
    b %= kMod;
  }
  return (b << 16) | a;
}

std::vector<uint8_t> zlib_compress(std::span<const uint8_t> data) {
  std::vector<uint8_t> out;
  out.reserve(data.size() / 8 + 64);
  out.push_back(0x78);  // CMF: deflate, 32 KiB window
  out.push_back(0x01);  // FLG: no dictionary, (CMF * 256 + FLG) % 31 == 0
  deflate_fixed(data, out);
  put_u32(out, adler32(data));
  return out;
}

std::vector<uint8_t> encode_png(const RgbImage& image) {
  const auto w = static_cast<size_t>(image.width()), h = static_cast<size_t>(image.height());
  std::vector<uint8_t> raw;
  raw.reserve(h * (w * 3 + 1));
  const auto& px = image.pixels();
  for (size_t y = 0; y < h; ++y) {
    raw.push_back(0);  // filter type 0 (None)
    raw.insert(raw.end(), px.begin() + static_cast<std::ptrdiff_t>(y * w * 3),
               px.begin() + static_cast<std::ptrdiff_t>((y + 1) * w * 3));
  }

  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32(ihdr, static_cast<uint32_t>(w));
  put_u32(ihdr, static_cast<uint32_t>(h));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // bit depth 8, truecolour, deflate, filter 0, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", zlib_compress(raw));
  put_chunk(out, "IEND", {});
  return out;
}

void write_png(const std::filesystem::path& path, const RgbImage& image) {
  const std::vector<uint8_t> bytes = encode_png(image);
  const std::filesystem::path dir = path.parent_path().empty() ? "." : path.parent_path();
  const std::filesystem::path tmp = dir / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  bool ok;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    ok = out.good();
  }
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, path, ec);
  if (!ok || ec) {
    std::filesystem::remove(tmp, ec);
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "cannot write " + path.string());
  }
}

}  // namespace swarm::plot
