// Exact grammars of bounded JSON numbers: integers in a range that are multiples of a step, and
// numbers in a range written as integers, decimals or with an exponent. No torch, no HTTP.
//
// Bounds are compared as exact decimals (the schema's number as JSON writes it), never as
// doubles. The languages have bounded digits, so a model cannot write forever:
//   * integers: at most 19 digits (what the unbounded integer grammar allows);
//   * numbers: a mantissa of at most kSignificantDigits digits (leading zeros of a fraction
//     count, the lone "0" before a point does not) and an exponent of at most
//     kExponentDigits digits (leading zeros allowed, as JSON allows them).
// Within that language the grammar is exact both ways: every text it accepts is in range, and
// every text of the language whose value is in range is accepted. 15 significant digits is
// also what makes the decimal comparison agree with a validator that parses numbers as binary64
// doubles: distinct decimals of at most 15 significant digits are distinct doubles, in the same
// order (see docs/openai_api.md, "Structured outputs").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.hpp"

namespace swarm::grammar {

/// An exact decimal: (negative ? -1 : 1) * digits * 10^exp. `digits` has no leading or trailing
/// zeros; empty means zero (never negative).
struct Decimal {
  bool negative = false;
  std::string digits;
  int64_t exp = 0;

  /// Parses a JSON number text ("-1.5e3"); throws std::invalid_argument on anything else.
  static Decimal parse(std::string_view text);
  bool is_zero() const { return digits.empty(); }
  /// This value times 10^by.
  Decimal shifted(int64_t by) const;
  Decimal abs() const {
    Decimal d = *this;
    d.negative = false;
    return d;
  }
  /// The integer part and the fraction digits of |value| ("" for a zero integer part; the
  /// fraction without trailing zeros).
  std::string int_part() const;
  std::string frac_part() const;
  /// A JSON spelling (for messages).
  std::string str() const;
};
/// -1, 0, 1 as a <, ==, > b.
int compare(const Decimal& a, const Decimal& b);

/// One end of a range; strict: the end itself is excluded.
struct NumberBound {
  Decimal value;
  bool strict = false;
};

inline constexpr int kSignificantDigits = 15;
inline constexpr int kExponentDigits = 2;
inline constexpr int kIntegerDigits = 19;

/// Builds the rules of bounded numbers into a grammar. Rules are shared between calls (one
/// builder per grammar). Not thread-safe.
class NumericGrammar {
 public:
  /// `check_size` is called as rules are added (it throws when the grammar grows too large).
  NumericGrammar(Grammar& g, std::function<void()> check_size);

  /// JSON integers n (at most kIntegerDigits digits, no "-0") with lo <= n <= hi (strict ends
  /// excluded; nullopt: unbounded) and n a multiple of `multiple` (>= 1). nullopt when no
  /// integer qualifies.
  std::optional<uint32_t> integer(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi,
                                  uint64_t multiple);
  /// JSON numbers (the language above) in the range. nullopt when none qualifies.
  std::optional<uint32_t> number(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi);
  /// Digit strings of one length `a.size() == b.size()` with a <= value <= b, leading zeros
  /// allowed, as a sequence (a rule reference when it branches).
  std::vector<Element> same_length_range(const std::string& a, const std::string& b);

 private:
  // One side of a range while a mantissa is read: FREE (no longer binds), DEAD (violated), or
  // TIGHT: the value read so far equals the bound's digits before `rest` (aligned), `rest` being
  // the bound's digits from here on without trailing zeros.
  struct Side {
    enum Kind : uint8_t { FREE, TIGHT, DEAD } kind = FREE;
    std::string rest;
    bool strict = false;
    std::string key() const;
  };
  static Side lower_side(const std::optional<NumberBound>& b, int int_len);
  static Side upper_side(const std::optional<NumberBound>& b, int int_len);
  static Side lower_after(const Side& lo, char c);
  static Side upper_after(const Side& hi, char c);
  static std::string bound_key(const std::optional<NumberBound>& b);
  std::optional<uint32_t> mantissa(const std::optional<NumberBound>& lo,
                                   const std::optional<NumberBound>& hi);
  std::optional<uint32_t> mantissa_state(int int_left, int frac_left, bool in_frac, bool first, Side lo,
                                         Side hi);
  // One alternative per run of digits first..9 that lead to the same rule (`target(d)`; nullopt:
  // the digit is not allowed), each a byte range after `prefix`.
  static std::vector<std::vector<Element>> digit_runs(
      const std::vector<Element>& prefix, int first,
      const std::function<std::optional<uint32_t>(int)>& target);
  std::optional<uint32_t> digit_state(int left, Side lo, Side hi, uint64_t residue, uint64_t multiple,
                                      bool first);
  std::optional<uint32_t> naturals(const std::optional<std::string>& lo, const std::optional<std::string>& hi,
                                   uint64_t multiple);
  // A mantissa's integer part of min_len..max_len digits where no bound binds, `read` read.
  uint32_t free_int(int read, int min_len, int max_len);
  uint32_t exponent(int64_t e1, int64_t e2);
  // Memoised rule building: build() runs once per key (nullopt: the language is empty).
  std::optional<uint32_t> memo(const std::string& key, const std::function<std::optional<uint32_t>()>& build);

  Grammar& g_;
  std::function<void()> check_size_;
  std::map<std::string, std::optional<uint32_t>> memo_;
};

}  // namespace swarm::grammar
