#include "grammar/numeric_grammar.hpp"

#include <stdexcept>
#include <utility>
#include <vector>

namespace swarm::grammar {
namespace {

using Seq = std::vector<Element>;

std::string strip_trailing_zeros(std::string s) {
  while (!s.empty() && s.back() == '0') s.pop_back();
  return s;
}

// The power of ten of the leading digit of a non-zero decimal.
int64_t top_power(const Decimal& d) { return static_cast<int64_t>(d.digits.size()) - 1 + d.exp; }

using Int = __int128;
const Int kIntLimit = [] {
  Int v = 1;
  for (int i = 0; i < kIntegerDigits; ++i) v *= 10;
  return v;  // integers have at most kIntegerDigits digits: |n| < kIntLimit
}();

std::string int_str(Int v) {
  if (v == 0) return "0";
  const bool neg = v < 0;
  if (neg) v = -v;
  std::string s;
  while (v > 0) {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return neg ? "-" + s : s;
}

// floor (down = true) or ceil of a decimal, clipped to (-kIntLimit, kIntLimit) as +-kIntLimit.
Int round_to_int(const Decimal& d, bool down) {
  if (d.is_zero()) return 0;
  if (top_power(d) >= kIntegerDigits) return d.negative ? -kIntLimit : kIntLimit;
  const std::string ip = d.int_part();
  Int v = 0;
  for (char c : ip) v = v * 10 + (c - '0');
  const bool fraction = !d.frac_part().empty();
  if (d.negative) v = -v;
  if (fraction && !d.negative && !down) v += 1;
  if (fraction && d.negative && down) v -= 1;
  return v;
}

// The decimal digit of `rest` at its front ('0' past its end: the rest has no trailing zeros).
char front(const std::string& rest) { return rest.empty() ? '0' : rest[0]; }

}  // namespace

// ------------------------------------------------------------------------------------ Decimal

Decimal Decimal::parse(std::string_view text) {
  auto bad = [&]() { return std::invalid_argument("not a JSON number: '" + std::string(text) + "'"); };
  size_t i = 0;
  Decimal d;
  bool neg = false;
  if (i < text.size() && text[i] == '-') {
    neg = true;
    ++i;
  }
  std::string digits;
  int64_t exp = 0;
  const size_t int_start = i;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') digits += text[i++];
  if (i == int_start) throw bad();
  if (i < text.size() && text[i] == '.') {
    ++i;
    const size_t frac_start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      digits += text[i++];
      --exp;
    }
    if (i == frac_start) throw bad();
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    bool eneg = false;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) eneg = text[i++] == '-';
    const size_t exp_start = i;
    int64_t e = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      if (e < 1'000'000) e = e * 10 + (text[i] - '0');
      ++i;
    }
    if (i == exp_start) throw bad();
    exp += eneg ? -e : e;
  }
  if (i != text.size()) throw bad();
  const size_t nz = digits.find_first_not_of('0');
  if (nz == std::string::npos) return d;  // zero, also "-0"
  digits.erase(0, nz);
  while (digits.back() == '0') {
    digits.pop_back();
    ++exp;
  }
  d.negative = neg;
  d.digits = std::move(digits);
  d.exp = exp;
  return d;
}

Decimal Decimal::shifted(int64_t by) const {
  Decimal d = *this;
  if (!d.is_zero()) d.exp += by;
  return d;
}

std::string Decimal::int_part() const {
  if (is_zero()) return "";
  if (exp >= 0) return digits + std::string(static_cast<size_t>(exp), '0');
  const int64_t len = static_cast<int64_t>(digits.size()) + exp;
  return len > 0 ? digits.substr(0, static_cast<size_t>(len)) : "";
}

std::string Decimal::frac_part() const {
  if (is_zero() || exp >= 0) return "";
  const int64_t len = static_cast<int64_t>(digits.size()) + exp;
  if (len > 0) return digits.substr(static_cast<size_t>(len));
  return std::string(static_cast<size_t>(-len), '0') + digits;
}

std::string Decimal::str() const {
  if (is_zero()) return "0";
  return std::string(negative ? "-" : "") + digits + (exp != 0 ? "e" + std::to_string(exp) : "");
}

int compare(const Decimal& a, const Decimal& b) {
  const int sa = a.is_zero() ? 0 : (a.negative ? -1 : 1), sb = b.is_zero() ? 0 : (b.negative ? -1 : 1);
  if (sa != sb) return sa < sb ? -1 : 1;
  if (sa == 0) return 0;
  // Same sign: compare magnitudes, then flip for negatives.
  int mag;
  if (top_power(a) != top_power(b)) {
    mag = top_power(a) < top_power(b) ? -1 : 1;
  } else {
    const size_t n = std::max(a.digits.size(), b.digits.size());
    std::string x = a.digits, y = b.digits;
    x.resize(n, '0');
    y.resize(n, '0');
    mag = x == y ? 0 : (x < y ? -1 : 1);
  }
  return sa > 0 ? mag : -mag;
}

// ------------------------------------------------------------------------------ NumericGrammar

NumericGrammar::NumericGrammar(Grammar& g, std::function<void()> check_size)
    : g_(g), check_size_(std::move(check_size)) {}

std::optional<uint32_t> NumericGrammar::memo(const std::string& key,
                                             const std::function<std::optional<uint32_t>()>& build) {
  if (auto it = memo_.find(key); it != memo_.end()) return it->second;
  std::optional<uint32_t> r = build();
  check_size_();
  memo_[key] = r;
  return r;
}

std::string NumericGrammar::Side::key() const {
  switch (kind) {
    case FREE:
      return "f";
    case DEAD:
      return "d";
    default:
      return std::string(strict ? "<" : "=") + rest;
  }
}

// A side after one more digit `c`: a lower bound is left behind by a larger digit, violated by
// a smaller one; an upper bound the other way round. A lower bound whose rest is all zeros and
// that is not strict holds whatever follows.
NumericGrammar::Side NumericGrammar::lower_after(const Side& lo, char c) {
  if (lo.kind != Side::TIGHT) return lo;
  const char a = front(lo.rest);
  if (c < a) return {Side::DEAD, "", false};
  if (c > a) return {};
  Side next{Side::TIGHT, lo.rest.empty() ? "" : lo.rest.substr(1), lo.strict};
  if (next.rest.empty() && !next.strict) return {};
  return next;
}

NumericGrammar::Side NumericGrammar::upper_after(const Side& hi, char c) {
  if (hi.kind != Side::TIGHT) return hi;
  const char b = front(hi.rest);
  if (c > b) return {Side::DEAD, "", false};
  if (c < b) return {};
  return {Side::TIGHT, hi.rest.empty() ? "" : hi.rest.substr(1), hi.strict};
}

std::string NumericGrammar::bound_key(const std::optional<NumberBound>& b) {
  return b ? b->value.str() + (b->strict ? "<" : "=") : std::string("-");
}

Seq NumericGrammar::same_length_range(const std::string& a, const std::string& b) {
  if (a.size() == 1) return {Element::bytes(static_cast<uint8_t>(a[0]), static_cast<uint8_t>(b[0]))};
  if (a.find_first_not_of('0') == std::string::npos && b.find_first_not_of('9') == std::string::npos)
    return Seq(a.size(), Element::bytes('0', '9'));  // every digit string of this length
  if (a[0] == b[0]) {
    Seq out{Element::byte(static_cast<uint8_t>(a[0]))};
    const Seq rest = same_length_range(a.substr(1), b.substr(1));
    out.insert(out.end(), rest.begin(), rest.end());
    return out;
  }
  const std::string nines(a.size() - 1, '9'), zeros(a.size() - 1, '0');
  std::vector<Seq> alts;
  Seq low{Element::byte(static_cast<uint8_t>(a[0]))};
  const Seq low_rest = same_length_range(a.substr(1), nines);
  low.insert(low.end(), low_rest.begin(), low_rest.end());
  alts.push_back(low);
  if (a[0] + 1 <= b[0] - 1) {
    Seq mid{Element::bytes(static_cast<uint8_t>(a[0] + 1), static_cast<uint8_t>(b[0] - 1))};
    for (size_t i = 1; i < a.size(); ++i) mid.push_back(Element::bytes('0', '9'));
    alts.push_back(mid);
  }
  Seq high{Element::byte(static_cast<uint8_t>(b[0]))};
  const Seq high_rest = same_length_range(zeros, b.substr(1));
  high.insert(high.end(), high_rest.begin(), high_rest.end());
  alts.push_back(high);
  check_size_();
  return {Element::rule(g_.rule_of(alts))};
}

// ---------------------------------------------------------------------------------- integers

std::vector<Seq> NumericGrammar::digit_runs(const Seq& prefix, int first,
                                            const std::function<std::optional<uint32_t>(int)>& target) {
  std::vector<Seq> alts;
  int run_start = first;
  std::optional<uint32_t> run_target = target(first);
  for (int d = first + 1; d <= 10; ++d) {
    const std::optional<uint32_t> t = d <= 9 ? target(d) : std::nullopt;
    if (d <= 9 && t == run_target) continue;
    if (run_target) {
      Seq alt = prefix;
      alt.push_back(Element::bytes(static_cast<uint8_t>('0' + run_start), static_cast<uint8_t>('0' + d - 1)));
      alt.push_back(Element::rule(*run_target));
      alts.push_back(std::move(alt));
    }
    run_start = d;
    run_target = t;
  }
  return alts;
}

// Exactly `left` more digits; lo / hi TIGHT hold the bound's remaining digits (same length).
std::optional<uint32_t> NumericGrammar::digit_state(int left, Side lo, Side hi, uint64_t residue,
                                                    uint64_t multiple, bool first) {
  if (lo.kind == Side::DEAD || hi.kind == Side::DEAD) return std::nullopt;
  const std::string key = "i" + std::to_string(left) + "|" + lo.key() + "|" + hi.key() + "|" +
                          std::to_string(residue) + "/" + std::to_string(multiple) + "|" +
                          (first ? "1" : "0");
  return memo(key, [&]() -> std::optional<uint32_t> {
    if (left == 0) {
      if (residue != 0) return std::nullopt;
      return g_.rule_of({{}});
    }
    const std::vector<Seq> alts = digit_runs({}, first ? 1 : 0, [&](int d) {
      const char c = static_cast<char>('0' + d);
      return digit_state(left - 1, lower_after(lo, c), upper_after(hi, c),
                         (residue * 10 + static_cast<uint64_t>(d)) % multiple, multiple, false);
    });
    if (alts.empty()) return std::nullopt;
    return g_.rule_of(alts);
  });
}

// Naturals without leading zeros in [lo, hi] (nullopt hi: up to kIntegerDigits digits).
std::optional<uint32_t> NumericGrammar::naturals(const std::optional<std::string>& lo,
                                                 const std::optional<std::string>& hi, uint64_t multiple) {
  const std::string a = lo.value_or("0");
  const size_t max_len = hi ? hi->size() : static_cast<size_t>(kIntegerDigits);
  std::vector<Seq> alts;
  for (size_t len = a.size(); len <= max_len; ++len) {
    const std::string first = len == a.size() ? a : "1" + std::string(len - 1, '0');
    const std::string last = hi && len == max_len ? *hi : std::string(len, '9');
    if (first > last) continue;
    if (auto r = digit_state(static_cast<int>(len), Side{Side::TIGHT, first, false},
                             Side{Side::TIGHT, last, false}, 0, multiple, false))
      alts.push_back({Element::rule(*r)});
  }
  if (alts.empty()) return std::nullopt;
  return g_.rule_of(alts);
}

std::optional<uint32_t> NumericGrammar::integer(const std::optional<NumberBound>& lo,
                                                const std::optional<NumberBound>& hi, uint64_t multiple) {
  if (multiple == 0) throw std::invalid_argument("multipleOf must be positive");
  // The smallest and largest admitted integers, clipped to what kIntegerDigits digits spell.
  Int a = -(kIntLimit - 1), b = kIntLimit - 1;
  if (lo) {
    Int v = round_to_int(lo->value, /*down=*/false);
    if (lo->strict && compare(Decimal::parse(int_str(v)), lo->value) == 0) ++v;
    a = std::max(a, v);
  }
  if (hi) {
    Int v = round_to_int(hi->value, /*down=*/true);
    if (hi->strict && compare(Decimal::parse(int_str(v)), hi->value) == 0) --v;
    b = std::min(b, v);
  }
  if (a > b) return std::nullopt;
  const bool lo_open = !lo || a <= -(kIntLimit - 1), hi_open = !hi || b >= kIntLimit - 1;
  std::vector<Seq> alts;
  if (b >= 0) {  // 0 <= n <= b
    const Int from = std::max<Int>(a, 0);
    if (auto r = naturals(int_str(from), hi_open ? std::nullopt : std::optional<std::string>(int_str(b)),
                          multiple))
      alts.push_back({Element::rule(*r)});
  }
  if (a < 0) {  // n = -v, max(1, -b) <= v <= -a
    const Int from = std::max<Int>(1, -b);
    if (auto r = naturals(int_str(from), lo_open ? std::nullopt : std::optional<std::string>(int_str(-a)),
                          multiple))
      alts.push_back({Element::byte('-'), Element::rule(*r)});
  }
  if (alts.empty()) return std::nullopt;
  return g_.rule_of(alts);
}

// ----------------------------------------------------------------------------------- numbers

// A mantissa (non-negative) whose integer part has int_len digits (0: the integer part is "0").
NumericGrammar::Side NumericGrammar::lower_side(const std::optional<NumberBound>& b, int int_len) {
  if (!b) return {};
  const std::string ip = b->value.int_part();
  const int len = static_cast<int>(ip.size());
  if (len > int_len) return {Side::DEAD, "", false};
  if (len < int_len) return {};
  Side s{Side::TIGHT, strip_trailing_zeros(ip + b->value.frac_part()), b->strict};
  if (s.rest.empty() && !s.strict) return {};  // x >= 0: any continuation
  return s;
}

NumericGrammar::Side NumericGrammar::upper_side(const std::optional<NumberBound>& b, int int_len) {
  if (!b) return {};
  const std::string ip = b->value.int_part();
  const int len = static_cast<int>(ip.size());
  if (len < int_len) return {Side::DEAD, "", false};
  if (len > int_len) return {};
  return {Side::TIGHT, strip_trailing_zeros(ip + b->value.frac_part()), b->strict};
}

std::optional<uint32_t> NumericGrammar::mantissa_state(int int_left, int frac_left, bool in_frac, bool first,
                                                       Side lo, Side hi) {
  if (lo.kind == Side::DEAD || hi.kind == Side::DEAD) return std::nullopt;
  const std::string key = "m" + std::to_string(int_left) + "|" + std::to_string(frac_left) + "|" +
                          (in_frac ? "f" : "i") + (first ? "1" : "0") + "|" + lo.key() + "|" + hi.key();
  return memo(key, [&]() -> std::optional<uint32_t> {
    std::vector<Seq> alts;
    const bool reading_int = int_left > 0;
    if (!reading_int) {
      // The value read so far is complete: below a tight lower bound (or equal to a strict one),
      // at most a tight upper bound (equal to it only when its rest is empty).
      const bool end_ok = lo.kind == Side::FREE && !(hi.kind == Side::TIGHT && hi.rest.empty() && hi.strict);
      if (end_ok) alts.push_back({});
      if (frac_left == 0) return alts.empty() ? std::nullopt : std::optional<uint32_t>(g_.rule_of(alts));
    }
    const Seq prefix = !reading_int && !in_frac ? Seq{Element::byte('.')} : Seq{};
    for (Seq& alt : digit_runs(prefix, first ? 1 : 0, [&](int d) {
           const char c = static_cast<char>('0' + d);
           const Side nlo = lower_after(lo, c), nhi = upper_after(hi, c);
           return reading_int ? mantissa_state(int_left - 1, frac_left, false, false, nlo, nhi)
                              : mantissa_state(0, frac_left - 1, true, false, nlo, nhi);
         }))
      alts.push_back(std::move(alt));
    if (alts.empty()) return std::nullopt;
    return g_.rule_of(alts);
  });
}

std::optional<uint32_t> NumericGrammar::mantissa(const std::optional<NumberBound>& lo,
                                                 const std::optional<NumberBound>& hi) {
  return memo("M" + bound_key(lo) + "|" + bound_key(hi), [&]() -> std::optional<uint32_t> {
    std::vector<Seq> alts;
    // Integer part "0": the fraction may use every significant digit.
    if (auto r = mantissa_state(0, kSignificantDigits, false, false, lower_side(lo, 0), upper_side(hi, 0)))
      alts.push_back({Element::byte('0'), Element::rule(*r)});
    // Integer lengths where neither bound binds form one run, read by one rule (one parse stack
    // instead of one per length); the lengths of the bounds themselves are compared digit by digit.
    int free_from = 0, free_to = -1;
    for (int len = 1; len <= kSignificantDigits; ++len) {
      const Side l = lower_side(lo, len), h = upper_side(hi, len);
      if (l.kind == Side::FREE && h.kind == Side::FREE) {
        if (free_to < 0) free_from = len;
        free_to = len;
        continue;
      }
      if (auto r = mantissa_state(len, kSignificantDigits - len, false, true, l, h))
        alts.push_back({Element::rule(*r)});
    }
    if (free_to >= free_from)
      alts.push_back({Element::bytes('1', '9'), Element::rule(free_int(1, free_from, free_to))});
    if (alts.empty()) return std::nullopt;
    return g_.rule_of(alts);
  });
}

uint32_t NumericGrammar::free_int(int read, int min_len, int max_len) {
  const std::string key =
      "F" + std::to_string(read) + "|" + std::to_string(min_len) + "|" + std::to_string(max_len);
  return *memo(key, [&]() -> std::optional<uint32_t> {
    std::vector<Seq> alts;
    if (read >= min_len)
      if (auto end = mantissa_state(0, kSignificantDigits - read, false, false, Side{}, Side{}))
        alts.push_back({Element::rule(*end)});
    if (read < max_len)
      alts.push_back({Element::bytes('0', '9'), Element::rule(free_int(read + 1, min_len, max_len))});
    return g_.rule_of(alts);
  });
}

uint32_t NumericGrammar::exponent(int64_t e1, int64_t e2) {
  const std::string key = "e" + std::to_string(e1) + "|" + std::to_string(e2);
  return *memo(key, [&]() -> std::optional<uint32_t> {
    // Magnitudes in [a, b] spelled with 1..kExponentDigits digits (leading zeros allowed).
    auto magnitudes = [&](int64_t a, int64_t b) {
      std::vector<Seq> alts;
      int64_t limit = 1;
      for (int len = 1; len <= kExponentDigits; ++len) {
        limit *= 10;
        const int64_t hi = std::min(b, limit - 1);
        if (a > hi) continue;
        auto pad = [&](int64_t v) {
          std::string s = std::to_string(v);
          return std::string(static_cast<size_t>(len) - s.size(), '0') + s;
        };
        alts.push_back(same_length_range(pad(a), pad(hi)));
      }
      return alts;
    };
    std::vector<Seq> signed_alts;
    if (e2 >= 0)
      for (const Seq& m : magnitudes(std::max<int64_t>(e1, 0), e2)) {
        signed_alts.push_back(m);
        Seq plus{Element::byte('+')};
        plus.insert(plus.end(), m.begin(), m.end());
        signed_alts.push_back(plus);
      }
    if (e1 <= 0)
      for (const Seq& m : magnitudes(std::max<int64_t>(0, -e2), -e1)) {
        Seq minus{Element::byte('-')};
        minus.insert(minus.end(), m.begin(), m.end());
        signed_alts.push_back(minus);
      }
    std::vector<Seq> alts;
    if (e1 <= 0 && e2 >= 0) alts.push_back({});  // no exponent: 10^0
    if (!signed_alts.empty()) {
      const uint32_t spelled = g_.rule_of(signed_alts);
      alts.push_back({Element::bytes('E', 'E'), Element::rule(spelled)});
      alts.push_back({Element::bytes('e', 'e'), Element::rule(spelled)});
    }
    return g_.rule_of(alts);
  });
}

std::optional<uint32_t> NumericGrammar::number(const std::optional<NumberBound>& lo,
                                               const std::optional<NumberBound>& hi) {
  // The two signs as ranges of a non-negative mantissa y times 10^e: x = y (positive) or
  // x = -y (negative). DEAD: no value of that sign is in range.
  struct Range {
    bool dead = false;
    std::optional<NumberBound> lo, hi;
  };
  const Decimal zero;
  auto sign_of = [](const std::optional<NumberBound>& b) {
    return !b ? 0 : b->value.is_zero() ? 0 : b->value.negative ? -1 : 1;
  };
  Range pos, neg;
  // x >= 0: y >= max(lo, 0), y <= hi.
  if (lo && sign_of(lo) > 0) pos.lo = lo;
  if (lo && sign_of(lo) == 0 && lo->strict) pos.lo = NumberBound{zero, true};
  if (hi) {
    if (sign_of(hi) < 0) pos.dead = true;
    pos.hi = NumberBound{hi->value.abs(), hi->strict};
  }
  // x <= 0: y >= max(-hi, 0), y <= -lo.
  if (hi && sign_of(hi) < 0) neg.lo = NumberBound{hi->value.abs(), hi->strict};
  if (hi && sign_of(hi) == 0 && hi->strict) neg.lo = NumberBound{zero, true};
  if (lo) {
    if (sign_of(lo) > 0) neg.dead = true;
    neg.hi = NumberBound{lo->value.abs(), lo->strict};
  }
  // The range of the mantissa for exponent e, clipped to what a mantissa can be: 0, or in
  // [10^-kSignificantDigits, 10^kSignificantDigits).
  auto clip = [&](const Range& r, int64_t e) -> Range {
    if (r.dead) return r;
    Range c;
    if (r.lo) {
      const Decimal v = r.lo->value.shifted(-e);
      if (v.is_zero())
        c.lo = r.lo->strict ? std::optional<NumberBound>(NumberBound{zero, true}) : std::nullopt;
      else if (top_power(v) >= kSignificantDigits)
        c.dead = true;
      else if (top_power(v) < -kSignificantDigits)
        c.lo = NumberBound{zero, true};  // y >= v > 0 holds for every y > 0
      else
        c.lo = NumberBound{v, r.lo->strict};
    }
    if (r.hi) {
      const Decimal v = r.hi->value.shifted(-e);
      if (v.is_zero()) {
        if (r.hi->strict) c.dead = true;
        c.hi = NumberBound{zero, false};
      } else if (top_power(v) >= kSignificantDigits) {
        c.hi = std::nullopt;  // every mantissa is below it
      } else if (top_power(v) < -kSignificantDigits) {
        c.hi = NumberBound{zero, false};  // only y = 0 is at most v
      } else {
        c.hi = NumberBound{v, r.hi->strict};
      }
    }
    return c;
  };
  auto key_of = [](const Range& r) {
    return r.dead ? std::string("dead") : bound_key(r.lo) + "," + bound_key(r.hi);
  };
  std::vector<Seq> alts;
  int64_t limit = 1;
  for (int i = 0; i < kExponentDigits; ++i) limit *= 10;
  // Exponents whose clipped ranges are equal share one alternative: they form runs, because
  // each clipped bound moves monotonically with e.
  int64_t run_start = -(limit - 1);
  std::string run_key;
  Range run_pos, run_neg;
  auto flush = [&](int64_t run_end) {
    std::optional<uint32_t> mp, mn;
    if (!run_pos.dead) mp = mantissa(run_pos.lo, run_pos.hi);
    if (!run_neg.dead) mn = mantissa(run_neg.lo, run_neg.hi);
    if (!mp && !mn) return;
    const uint32_t ex = exponent(run_start, run_end);
    if (mp) alts.push_back({Element::rule(*mp), Element::rule(ex)});
    if (mn) alts.push_back({Element::byte('-'), Element::rule(*mn), Element::rule(ex)});
  };
  for (int64_t e = -(limit - 1); e <= limit - 1; ++e) {
    const Range p = clip(pos, e), n = clip(neg, e);
    const std::string key = key_of(p) + "/" + key_of(n);
    if (e > -(limit - 1) && key != run_key) {
      flush(e - 1);
      run_start = e;
    }
    run_key = key;
    run_pos = p;
    run_neg = n;
  }
  flush(limit - 1);
  if (alts.empty()) return std::nullopt;
  check_size_();
  return g_.rule_of(alts);
}

}  // namespace swarm::grammar
