#include "text/tokenizer_unicode.hpp"

#include <algorithm>
#include <array>
#include <vector>

namespace swarm::unicode {
namespace {

using namespace swarm::unicode_data;

constexpr uint32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161, kHangulTBase = 0x11A7;
constexpr uint32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr uint32_t kHangulNCount = kHangulVCount * kHangulTCount;
constexpr uint32_t kHangulSCount = kHangulLCount * kHangulNCount;

enum QuickCheck : uint8_t { QC_YES = 0, QC_MAYBE = 1, QC_NO = 2 };

bool in_ranges(const CodePointRange* ranges, size_t n, uint32_t cp) {
  const CodePointRange* end = ranges + n;
  auto it =
      std::upper_bound(ranges, end, cp, [](uint32_t v, const CodePointRange& r) { return v < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

uint8_t ccc_slow(uint32_t cp) {
  const CccRange* end = kCccRanges + kCccRangesSize;
  auto it = std::upper_bound(kCccRanges, end, cp, [](uint32_t v, const CccRange& r) { return v < r.first; });
  if (it != kCccRanges && cp <= (it - 1)->last) return static_cast<uint8_t>((it - 1)->ccc);
  return 0;
}

uint8_t qc_slow(uint32_t cp) {
  if (in_ranges(kQcNoRanges, kQcNoRangesSize, cp)) return QC_NO;
  if (in_ranges(kQcMaybeRanges, kQcMaybeRangesSize, cp)) return QC_MAYBE;
  return QC_YES;
}

// Direct lookup for the BMP (where nearly all text lives); binary search above it.
struct BmpTables {
  std::array<uint8_t, 0x10000> ccc{};
  std::array<uint8_t, 0x10000> qc{};
  BmpTables() {
    for (size_t i = 0; i < kCccRangesSize; ++i)
      for (uint32_t cp = kCccRanges[i].first; cp <= kCccRanges[i].last && cp < 0x10000; ++cp)
        ccc[cp] = static_cast<uint8_t>(kCccRanges[i].ccc);
    for (size_t i = 0; i < kQcMaybeRangesSize; ++i)
      for (uint32_t cp = kQcMaybeRanges[i].first; cp <= kQcMaybeRanges[i].last && cp < 0x10000; ++cp)
        qc[cp] = QC_MAYBE;
    for (size_t i = 0; i < kQcNoRangesSize; ++i)
      for (uint32_t cp = kQcNoRanges[i].first; cp <= kQcNoRanges[i].last && cp < 0x10000; ++cp)
        qc[cp] = QC_NO;
  }
};

const BmpTables& bmp() {
  static const BmpTables tables;
  return tables;
}

inline uint8_t quick_check(uint32_t cp) { return cp < 0x10000 ? bmp().qc[cp] : qc_slow(cp); }

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    uint32_t s = cp - kHangulSBase;
    out.push_back(kHangulLBase + s / kHangulNCount);
    out.push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  const Decomposition* end = kDecompositions + kDecompositionsSize;
  auto it =
      std::lower_bound(kDecompositions, end, cp, [](const Decomposition& d, uint32_t v) { return d.cp < v; });
  if (it == end || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

// Primary composite of (a, b), or 0.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kHangulLBase && a < kHangulLBase + kHangulLCount && b >= kHangulVBase &&
      b < kHangulVBase + kHangulVCount)
    return kHangulSBase + ((a - kHangulLBase) * kHangulVCount + (b - kHangulVBase)) * kHangulTCount;
  if (a >= kHangulSBase && a < kHangulSBase + kHangulSCount && (a - kHangulSBase) % kHangulTCount == 0 &&
      b > kHangulTBase && b < kHangulTBase + kHangulTCount)
    return a + (b - kHangulTBase);
  const Composition* end = kCompositions + kCompositionsSize;
  auto it = std::lower_bound(kCompositions, end, std::pair<uint32_t, uint32_t>{a, b},
                             [](const Composition& c, const std::pair<uint32_t, uint32_t>& v) {
                               return c.first != v.first ? c.first < v.first : c.second < v.second;
                             });
  if (it != end && it->first == a && it->second == b) return it->composite;
  return 0;
}

// Normalizes one segment (a starter followed by whatever cannot be cut off from it).
void normalize_segment(std::string_view seg, std::string& out, std::vector<uint32_t>& buf) {
  buf.clear();
  for (size_t i = 0; i < seg.size();) decompose(next_code_point(seg, i), buf);
  // Canonical ordering: stable sort of each run of non-starters by combining class.
  for (size_t i = 1; i < buf.size(); ++i) {
    uint8_t c = combining_class(buf[i]);
    if (c == 0) continue;
    size_t j = i;
    while (j > 0 && combining_class(buf[j - 1]) > c) {
      std::swap(buf[j], buf[j - 1]);
      --j;
    }
  }
  // Canonical composition.
  size_t starter = SIZE_MAX;  // index in buf of the last starter kept
  int last_class = -1;        // class of the last char kept after the starter; -1: none
  size_t w = 0;
  for (size_t i = 0; i < buf.size(); ++i) {
    uint32_t cp = buf[i];
    int c = combining_class(cp);
    if (starter != SIZE_MAX && (last_class == -1 || (last_class != 0 && last_class < c))) {
      if (uint32_t composite = compose_pair(buf[starter], cp)) {
        buf[starter] = composite;
        continue;
      }
    }
    if (c == 0) {
      starter = w;
      last_class = -1;
    } else {
      last_class = c;
    }
    buf[w++] = cp;
  }
  for (size_t i = 0; i < w; ++i) append_utf8(out, buf[i]);
}

}  // namespace

size_t valid_sequence_length(std::string_view s, size_t i, size_t* maximal_subpart) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    if (maximal_subpart) *maximal_subpart = 1;
    return 0;
  }
  size_t k = 1;
  for (; k <= need; ++k) {
    if (i + k >= s.size()) break;
    unsigned char b = byte(i + k);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  if (k == need + 1) return need + 1;
  if (maximal_subpart) *maximal_subpart = k;
  return 0;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = valid_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

void append_lossy(std::string& out, std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t bad = 0;
    size_t n = valid_sequence_length(s, i, &bad);
    if (n > 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
}

bool is_white_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

uint8_t combining_class(uint32_t cp) { return cp < 0x10000 ? bmp().ccc[cp] : ccc_slow(cp); }

bool nfc(std::string_view s, std::string& out) {
  // Quick check: find the first character that might change; all of U+0000..U+02FF are NFC
  // starters (asserted by the table generator).
  size_t safe = 0;  // byte offset of the last character a segment may start at
  uint8_t last_class = 0;
  size_t i = 0;
  bool clean = true;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0xCC) {  // below U+0300
      safe = i;
      last_class = 0;
      i += char_length(c);
      continue;
    }
    size_t at = i;
    uint32_t cp = next_code_point(s, i);
    uint8_t cc = combining_class(cp);
    if (quick_check(cp) != QC_YES || (cc != 0 && cc < last_class)) {
      clean = false;
      break;
    }
    if (cc == 0) safe = at;
    last_class = cc;
  }
  if (clean) return false;

  out.clear();
  out.reserve(s.size() + 16);
  out.append(s.data(), safe);
  std::vector<uint32_t> buf;
  // Cut the rest into segments, each starting at a character that is a starter and cannot
  // combine with what precedes it (ccc 0 and NFC_QC Yes); they normalize independently.
  size_t start = safe;
  i = safe;
  if (i < s.size()) next_code_point(s, i);
  while (i <= s.size()) {
    bool boundary = i == s.size();
    size_t at = i;
    if (!boundary) {
      uint32_t cp = next_code_point(s, i);
      boundary = combining_class(cp) == 0 && quick_check(cp) == QC_YES;
    }
    if (boundary) {
      normalize_segment(s.substr(start, at - start), out, buf);
      start = at;
      if (at == s.size()) break;
    }
  }
  return true;
}

}  // namespace swarm::unicode
