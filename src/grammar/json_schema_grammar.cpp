#include "grammar/json_schema_grammar.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "grammar/numeric_grammar.hpp"
#include "grammar/pattern_grammar.hpp"

namespace swarm::grammar {
namespace {

using json = nlohmann::ordered_json;  // properties are generated in the schema's order
using Seq = std::vector<Element>;

const std::set<std::string> kAnnotations = {"$schema",  "$id",       "title",        "description",
                                            "default",  "examples",  "$comment",     "deprecated",
                                            "readOnly", "writeOnly", "discriminator"};
const std::set<std::string> kCommon = {"type",  "enum", "const", "anyOf",       "oneOf",
                                       "allOf", "$ref", "$defs", "definitions", "nullable"};
const std::map<std::string, std::set<std::string>> kByType = {
    {"object", {"properties", "required", "additionalProperties"}},
    {"array", {"items", "prefixItems", "additionalItems", "minItems", "maxItems"}},
    {"string", {"minLength", "maxLength", "format", "pattern"}},
    {"integer", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
    {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
    {"boolean", {}},
    {"null", {}},
};

Seq cat(std::initializer_list<Seq> parts) {
  Seq out;
  for (const Seq& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}
Seq lit(std::string_view s) { return Grammar::literal(s); }
Seq ref(uint32_t r) { return {Element::rule(r)}; }

}  // namespace

struct JsonSchemaCompiler::Impl {
  Grammar& g;
  const json& root;
  JsonGrammarLimits limits;
  std::map<std::string, uint32_t> refs;  // "$ref" target -> rule
  std::optional<uint32_t> ws_rule, char_rule, chars_rule, digits_rule, any_rule, string_rule, number_rule,
      integer_rule;
  std::map<std::pair<int64_t, bool>, uint32_t> char_runs;  // (n, optional) -> rule of up to / exactly n chars

  NumericGrammar numeric;

  Impl(Grammar& grammar, const json& r, JsonGrammarLimits l)
      : g(grammar), root(r), limits(l), numeric(grammar, [this] { check_size(); }) {}

  void check_size() {
    if (g.num_rules() > limits.max_rules)
      throw SchemaError("schema too large: its grammar exceeds " + std::to_string(limits.max_rules) +
                        " rules");
  }

  uint32_t ws() {
    if (ws_rule) return *ws_rule;
    // sp_k: up to k spaces.
    uint32_t sp = g.rule_of({{}}, "sp0");
    for (int k = 1; k <= 16; ++k) sp = g.rule_of({{}, cat({lit(" "), ref(sp)})}, "sp" + std::to_string(k));
    ws_rule = g.rule_of({{}, lit(" "), cat({lit("\n"), ref(sp)})}, "ws");
    return *ws_rule;
  }

  // One character inside a JSON string: unescaped UTF-8 (well-formed) or an escape.
  uint32_t string_char() {
    if (char_rule) return *char_rule;
    const auto B = Element::bytes;
    const uint32_t hex = g.rule_of({{B('0', '9')}, {B('a', 'f')}, {B('A', 'F')}}, "hex");
    const uint32_t esc = g.rule_of({{Element::byte('"')},
                                    {Element::byte('\\')},
                                    {Element::byte('/')},
                                    {Element::byte('b')},
                                    {Element::byte('f')},
                                    {Element::byte('n')},
                                    {Element::byte('r')},
                                    {Element::byte('t')},
                                    cat({lit("u"), ref(hex), ref(hex), ref(hex), ref(hex)})},
                                   "escape");
    char_rule = g.rule_of({{B(0x20, 0x21)},
                           {B(0x23, 0x5B)},
                           {B(0x5D, 0x7F)},
                           cat({lit("\\"), ref(esc)}),
                           {B(0xC2, 0xDF), B(0x80, 0xBF)},
                           {Element::byte(0xE0), B(0xA0, 0xBF), B(0x80, 0xBF)},
                           {B(0xE1, 0xEC), B(0x80, 0xBF), B(0x80, 0xBF)},
                           {Element::byte(0xED), B(0x80, 0x9F), B(0x80, 0xBF)},
                           {B(0xEE, 0xEF), B(0x80, 0xBF), B(0x80, 0xBF)},
                           {Element::byte(0xF0), B(0x90, 0xBF), B(0x80, 0xBF), B(0x80, 0xBF)},
                           {B(0xF1, 0xF3), B(0x80, 0xBF), B(0x80, 0xBF), B(0x80, 0xBF)},
                           {Element::byte(0xF4), B(0x80, 0x8F), B(0x80, 0xBF), B(0x80, 0xBF)}},
                          "char");
    return *char_rule;
  }

  uint32_t chars() {  // any number of characters
    if (chars_rule) return *chars_rule;
    const uint32_t r = g.add_rule("chars");
    g.add_alternative(r, {});
    g.add_alternative(r, cat({ref(string_char()), ref(r)}));
    chars_rule = r;
    return r;
  }

  // Up to n characters (optional) or exactly n.
  uint32_t char_run(int64_t n, bool optional) {
    auto key = std::make_pair(n, optional);
    if (auto it = char_runs.find(key); it != char_runs.end()) return it->second;
    uint32_t r;
    if (n == 0) {
      r = g.rule_of({{}});
    } else {
      const uint32_t prev = char_run(n - 1, optional);
      r = optional ? g.rule_of({{}, cat({ref(string_char()), ref(prev)})})
                   : g.rule_of({cat({ref(string_char()), ref(prev)})});
    }
    check_size();
    char_runs[key] = r;
    return r;
  }

  uint32_t string(std::optional<int64_t> min_len, std::optional<int64_t> max_len, const std::string& path) {
    const int64_t lo = min_len.value_or(0);
    if (lo < 0 || (max_len && *max_len < lo)) throw SchemaError("invalid minLength/maxLength at " + path);
    if (lo > limits.max_repeat_bound || (max_len && *max_len > limits.max_repeat_bound))
      throw SchemaError("minLength/maxLength above " + std::to_string(limits.max_repeat_bound) + " at " +
                        path + " is not supported");
    if (!min_len && !max_len) {
      if (!string_rule) string_rule = g.rule_of({cat({lit("\""), ref(chars()), lit("\"")})}, "string");
      return *string_rule;
    }
    Seq body = cat({lit("\""), ref(char_run(lo, false))});
    body.push_back(Element::rule(max_len ? char_run(*max_len - lo, true) : chars()));
    body.push_back(Element::byte('"'));
    return g.rule_of({body});
  }

  uint32_t digits(int max_more) {  // up to max_more further digits
    uint32_t r = g.rule_of({{}});
    for (int k = 1; k <= max_more; ++k) r = g.rule_of({{}, {Element::bytes('0', '9'), Element::rule(r)}});
    return r;
  }

  uint32_t integer_unbounded() {
    if (integer_rule) return *integer_rule;
    if (!digits_rule) digits_rule = digits(18);
    const uint32_t nat =
        g.rule_of({lit("0"), {Element::bytes('1', '9'), Element::rule(*digits_rule)}}, "natural");
    integer_rule = g.rule_of({ref(nat), cat({lit("-"), ref(nat)})}, "integer");
    return *integer_rule;
  }

  uint32_t number() {
    if (number_rule) return *number_rule;
    const uint32_t integer = integer_unbounded();
    const uint32_t frac_digits = digits(15);
    const uint32_t frac =
        g.rule_of({{}, {Element::byte('.'), Element::bytes('0', '9'), Element::rule(frac_digits)}}, "frac");
    const uint32_t exp_digits = digits(2);
    const uint32_t sign = g.rule_of({{}, lit("+"), lit("-")});
    const uint32_t exp = g.rule_of(
        {{},
         {Element::bytes('E', 'E'), Element::rule(sign), Element::bytes('0', '9'), Element::rule(exp_digits)},
         {Element::bytes('e', 'e'), Element::rule(sign), Element::bytes('0', '9'),
          Element::rule(exp_digits)}},
        "exp");
    number_rule = g.rule_of({cat({ref(integer), ref(frac), ref(exp)})}, "number");
    return *number_rule;
  }

  // The bounds of a number or integer schema: the tighter of minimum / exclusiveMinimum and of
  // maximum / exclusiveMaximum, read as exact decimals.
  std::pair<std::optional<NumberBound>, std::optional<NumberBound>> bounds(const json& s,
                                                                           const std::string& path) {
    std::optional<NumberBound> lo, hi;
    auto bound = [&](const char* key, bool lower, bool strict) {
      auto it = s.find(key);
      if (it == s.end()) return;
      if (!it->is_number()) {
        if (strict && it->is_boolean())
          throw SchemaError("boolean '" + std::string(key) + "' (draft 4) at " + path + " is not supported");
        throw SchemaError("'" + std::string(key) + "' at " + path + " must be a number");
      }
      const NumberBound b{Decimal::parse(it->dump()), strict};
      std::optional<NumberBound>& slot = lower ? lo : hi;
      const int c = slot ? compare(b.value, slot->value) : 0;
      if (!slot || (lower ? c > 0 : c < 0) || (c == 0 && strict)) slot = b;
    };
    bound("minimum", true, false);
    bound("exclusiveMinimum", true, true);
    bound("maximum", false, false);
    bound("exclusiveMaximum", false, true);
    return {lo, hi};
  }

  // multipleOf on an integer: the integers that are multiples of a decimal p/q (in lowest terms)
  // are the multiples of p.
  uint64_t integer_step(const json& s, const std::string& path) {
    auto it = s.find("multipleOf");
    if (it == s.end()) return 1;
    if (!it->is_number() || it->get<double>() <= 0)
      throw SchemaError("'multipleOf' at " + path + " must be a number greater than 0");
    const Decimal m = Decimal::parse(it->dump());
    if (m.digits.size() > 18 || m.exp > 18)
      throw SchemaError("'multipleOf' " + it->dump() + " at " + path + " is not supported (too many digits)");
    uint64_t p = std::stoull(m.digits);
    if (m.exp >= 0) {
      for (int64_t i = 0; i < m.exp; ++i) {
        if (p > UINT64_MAX / 10)
          throw SchemaError("'multipleOf' " + it->dump() + " at " + path + " is not supported (too large)");
        p *= 10;
      }
    } else {
      // Divide p by the factors of 2 and 5 that 10^-exp cancels.
      for (int64_t i = 0; i < -m.exp; ++i) {
        if (p % 2 == 0) p /= 2;
        if (p % 5 == 0) p /= 5;
      }
    }
    // The residue of each digit prefix is part of the grammar's state: keep it small.
    if (p > 500)
      throw SchemaError("'multipleOf' " + it->dump() + " at " + path +
                        " is not supported on integers (steps up to 500 are)");
    return p;
  }

  uint32_t integer(const json& s, const std::string& path) {
    const auto [lo, hi] = bounds(s, path);
    const uint64_t step = integer_step(s, path);
    if (!lo && !hi && step == 1) return integer_unbounded();
    const std::optional<uint32_t> r = numeric.integer(lo, hi, step);
    if (!r) throw SchemaError("no integer satisfies the bounds at " + path);
    return *r;
  }

  uint32_t bounded_number(const json& s, const std::string& path) {
    if (s.contains("multipleOf"))
      throw SchemaError("'multipleOf' on a number at " + path + " is not supported (on integers it is)");
    const auto [lo, hi] = bounds(s, path);
    if (!lo && !hi) return number();
    const std::optional<uint32_t> r = numeric.number(lo, hi);
    if (!r) throw SchemaError("no number satisfies the bounds at " + path);
    return *r;
  }

  // The practical subsets of the other formats (docs/openai_api.md lists them); each only
  // produces valid values, none needs a JSON escape.
  std::optional<uint32_t> ipv4_rule, ipv6_rule, hostname_rule, email_rule, uri_rule;

  // Characters of a set given as byte ranges, as one rule.
  uint32_t char_set(std::initializer_list<std::pair<char, char>> ranges) {
    std::vector<Seq> alts;
    for (const auto& [lo, hi] : ranges)
      alts.push_back({Element::bytes(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi))});
    return g.rule_of(alts);
  }
  // One or more of `item`, right-recursive.
  uint32_t one_or_more(uint32_t item) {
    const uint32_t r = g.add_rule();
    g.add_alternative(r, ref(item));
    g.add_alternative(r, cat({ref(item), ref(r)}));
    return r;
  }
  uint32_t zero_or_more(uint32_t item) {
    const uint32_t r = g.add_rule();
    g.add_alternative(r, {});
    g.add_alternative(r, cat({ref(item), ref(r)}));
    return r;
  }

  // Dotted decimal, each octet 0-255 without leading zeros.
  uint32_t ipv4() {
    if (ipv4_rule) return *ipv4_rule;
    const uint32_t octet =
        *numeric.integer(NumberBound{Decimal{}, false}, NumberBound{Decimal::parse("255"), false}, 1);
    ipv4_rule = g.rule_of(
        {cat({ref(octet), lit("."), ref(octet), lit("."), ref(octet), lit("."), ref(octet)})}, "ipv4");
    return *ipv4_rule;
  }

  // Eight groups of 1-4 hex digits, or fewer around one "::" (RFC 4291 2.2, without the
  // embedded IPv4 form).
  uint32_t ipv6() {
    if (ipv6_rule) return *ipv6_rule;
    const uint32_t hex = char_set({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
    const uint32_t h16 = g.rule_of({ref(hex), cat({ref(hex), ref(hex)}), cat({ref(hex), ref(hex), ref(hex)}),
                                    cat({ref(hex), ref(hex), ref(hex), ref(hex)})},
                                   "h16");
    // groups(n): exactly n groups joined by ':'; upto(m): 0..m groups joined by ':'.
    std::vector<uint32_t> groups{g.rule_of({{}})}, more{g.rule_of({{}})};
    for (int n = 1; n <= 8; ++n) {
      groups.push_back(g.rule_of({n == 1 ? ref(h16) : cat({ref(h16), lit(":"), ref(groups[n - 1])})}));
      more.push_back(g.rule_of({{}, cat({lit(":"), ref(h16), ref(more[n - 1])})}));  // ':' h16, up to n times
    }
    std::vector<Seq> alts{ref(groups[8])};
    for (int a = 0; a <= 7; ++a) {
      const int b = 7 - a;  // at most this many groups after "::"
      Seq right = b == 0 ? Seq{} : ref(g.rule_of({{}, cat({ref(h16), ref(more[b - 1])})}));
      alts.push_back(cat({ref(groups[a]), lit("::"), right}));
    }
    ipv6_rule = g.rule_of(alts, "ipv6");
    return *ipv6_rule;
  }

  // 1 to 5 labels of 1 to 48 letters, digits and inner hyphens, joined by dots (RFC 1123; at
  // most 244 characters, within the 253 allowed).
  uint32_t hostname() {
    if (hostname_rule) return *hostname_rule;
    const uint32_t alnum = char_set({{'0', '9'}, {'a', 'z'}, {'A', 'Z'}});
    const uint32_t inner = char_set({{'0', '9'}, {'a', 'z'}, {'A', 'Z'}, {'-', '-'}});
    // ending(n): 1 to n characters, the last one not a hyphen.
    uint32_t ending = alnum;
    for (int n = 2; n <= 47; ++n) ending = g.rule_of({ref(alnum), cat({ref(inner), ref(ending)})});
    const uint32_t label = g.rule_of({ref(alnum), cat({ref(alnum), ref(ending)})}, "label");
    uint32_t labels = label;
    for (int n = 2; n <= 5; ++n) labels = g.rule_of({ref(label), cat({ref(label), lit("."), ref(labels)})});
    hostname_rule = g.rule_of({ref(labels)}, "hostname");
    return *hostname_rule;
  }

  // A dot-atom local part (RFC 5322 atext; 1 to 4 atoms of up to 15 characters, so at most 63
  // of the 64 allowed), "@", a hostname.
  uint32_t email() {
    if (email_rule) return *email_rule;
    const uint32_t atext = char_set({{'0', '9'},
                                     {'a', 'z'},
                                     {'A', 'Z'},
                                     {'!', '!'},
                                     {'#', '\''},
                                     {'*', '+'},
                                     {'-', '-'},
                                     {'/', '/'},
                                     {'=', '='},
                                     {'?', '?'},
                                     {'^', '`'},
                                     {'{', '~'}});
    uint32_t more = g.rule_of({{}});
    for (int n = 1; n <= 14; ++n) more = g.rule_of({{}, cat({ref(atext), ref(more)})});
    const uint32_t atom = g.rule_of({cat({ref(atext), ref(more)})});
    uint32_t local = atom;
    for (int n = 2; n <= 4; ++n) local = g.rule_of({ref(atom), cat({ref(atom), lit("."), ref(local)})});
    email_rule = g.rule_of({cat({ref(local), lit("@"), ref(hostname())})}, "email");
    return *email_rule;
  }

  // scheme "://" host [":" port] path ["?" query] ["#" fragment] (RFC 3986 3, with a hostname or
  // IPv4 host and no user information).
  uint32_t uri() {
    if (uri_rule) return *uri_rule;
    const uint32_t alpha = char_set({{'a', 'z'}, {'A', 'Z'}});
    const uint32_t scheme_char = char_set({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'+', '+'}, {'-', '.'}});
    const uint32_t scheme = g.rule_of({cat({ref(alpha), ref(zero_or_more(scheme_char))})}, "scheme");
    const uint32_t hex = char_set({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
    // pchar: unreserved, sub-delims, ':' and '@' (ranges of ASCII), or a percent-encoding.
    const uint32_t pchar = g.rule_of({{Element::byte('!')},
                                      {Element::byte('$')},
                                      {Element::bytes('&', '.')},
                                      {Element::bytes('0', ';')},
                                      {Element::byte('=')},
                                      {Element::bytes('@', 'Z')},
                                      {Element::byte('_')},
                                      {Element::bytes('a', 'z')},
                                      {Element::byte('~')},
                                      cat({lit("%"), ref(hex), ref(hex)})},
                                     "pchar");
    const uint32_t segment = zero_or_more(pchar);
    const uint32_t path = zero_or_more(g.rule_of({cat({lit("/"), ref(segment)})}));
    const uint32_t qchar = g.rule_of({ref(pchar), lit("/"), lit("?")});
    const uint32_t query = g.rule_of({{}, cat({lit("?"), ref(zero_or_more(qchar))})});
    const uint32_t fragment = g.rule_of({{}, cat({lit("#"), ref(zero_or_more(qchar))})});
    const uint32_t digit = char_set({{'0', '9'}});
    uint32_t port_digits = g.rule_of({{}});
    for (int n = 1; n <= 4; ++n) port_digits = g.rule_of({{}, cat({ref(digit), ref(port_digits)})});
    const uint32_t port = g.rule_of({{}, cat({lit(":"), ref(digit), ref(port_digits)})});
    const uint32_t host = g.rule_of({ref(hostname()), ref(ipv4())});
    uri_rule = g.rule_of(
        {cat({ref(scheme), lit("://"), ref(host), ref(port), ref(path), ref(query), ref(fragment)})}, "uri");
    return *uri_rule;
  }

  // Strings of a `format`, exactly as RFC 3339 / RFC 4122 define them (upper-case T and Z):
  // date (days per month, 29 February only in leap years), time (with an offset), date-time,
  // uuid. Other formats are refused: an unchecked format would silently not be honoured.
  uint32_t formatted_string(const std::string& format, const std::string& path) {
    const auto B = Element::bytes;
    const auto D = [&](char lo, char hi) {
      return Element::bytes(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
    };
    const auto digit = D('0', '9');
    auto date = [&]() {
      // Leap years: the last two digits a non-zero multiple of 4, or 00 after a multiple of 4.
      std::vector<Seq> leap_tail, leap_century;
      for (int v = 4; v <= 96; v += 4)
        leap_tail.push_back(
            lit(std::string(1, static_cast<char>('0' + v / 10)) + static_cast<char>('0' + v % 10)));
      for (int v = 0; v <= 96; v += 4)
        leap_century.push_back(
            lit(std::string(1, static_cast<char>('0' + v / 10)) + static_cast<char>('0' + v % 10) + "00"));
      const uint32_t tail = g.rule_of(leap_tail);
      const uint32_t century = g.rule_of(leap_century);
      const uint32_t leap_year = g.rule_of({{digit, digit, Element::rule(tail)}, ref(century)}, "leap_year");
      const uint32_t year = g.rule_of({{digit, digit, digit, digit}}, "year");
      const uint32_t d28 = g.rule_of({{Element::byte('0'), D('1', '9')},
                                      {Element::byte('1'), digit},
                                      {Element::byte('2'), D('0', '8')}});
      const uint32_t d30 = g.rule_of({ref(d28), lit("29"), lit("30")});
      const uint32_t d31 = g.rule_of({ref(d30), lit("31")});
      std::vector<Seq> alts;
      for (const char* m : {"01", "03", "05", "07", "08", "10", "12"})
        alts.push_back(cat({ref(year), lit("-"), lit(m), lit("-"), ref(d31)}));
      for (const char* m : {"04", "06", "09", "11"})
        alts.push_back(cat({ref(year), lit("-"), lit(m), lit("-"), ref(d30)}));
      alts.push_back(cat({ref(year), lit("-02-"), ref(d28)}));
      alts.push_back(cat({ref(leap_year), lit("-02-29")}));
      return g.rule_of(alts, "date");
    };
    auto time = [&]() {
      const uint32_t hour = g.rule_of({{D('0', '1'), digit}, {Element::byte('2'), D('0', '3')}}, "hour");
      const uint32_t minute = g.rule_of({{D('0', '5'), digit}}, "minute");
      const uint32_t frac = g.rule_of({{}, {Element::byte('.'), digit, Element::rule(digits(8))}}, "secfrac");
      const uint32_t offset = g.rule_of({lit("Z"), cat({{B('+', '+')}, ref(hour), lit(":"), ref(minute)}),
                                         cat({{B('-', '-')}, ref(hour), lit(":"), ref(minute)})},
                                        "offset");
      return g.rule_of(
          {cat({ref(hour), lit(":"), ref(minute), lit(":"), ref(minute), ref(frac), ref(offset)})}, "time");
    };
    Seq body;
    if (format == "date") {
      body = ref(date());
    } else if (format == "time") {
      body = ref(time());
    } else if (format == "date-time") {
      body = cat({ref(date()), lit("T"), ref(time())});
    } else if (format == "uuid") {
      const uint32_t hex = g.rule_of({{digit}, {D('a', 'f')}, {D('A', 'F')}}, "hexdigit");
      for (int group : {8, 4, 4, 4, 12}) {
        if (!body.empty()) body.push_back(Element::byte('-'));
        for (int i = 0; i < group; ++i) body.push_back(Element::rule(hex));
      }
    } else if (format == "ipv4") {
      body = ref(ipv4());
    } else if (format == "ipv6") {
      body = ref(ipv6());
    } else if (format == "hostname") {
      body = ref(hostname());
    } else if (format == "email") {
      body = ref(email());
    } else if (format == "uri") {
      body = ref(uri());
    } else {
      throw SchemaError("'format' '" + format + "' at " + path +
                        " is not supported (supported: date, time, date-time, uuid, email, hostname, ipv4, "
                        "ipv6, uri)");
    }
    check_size();
    return g.rule_of({cat({lit("\""), body, lit("\"")})});
  }

  uint32_t any_value() {
    if (any_rule) return *any_rule;
    const uint32_t value = g.add_rule("any");
    any_rule = value;
    const uint32_t w = ws();
    const uint32_t str = string(std::nullopt, std::nullopt, "#");
    // object: { ws (string ws : ws value (ws , ws string ws : ws value)*)? ws }
    const uint32_t member = g.rule_of({cat({ref(str), ref(w), lit(":"), ref(w), ref(value)})}, "member");
    const uint32_t members_tail = g.add_rule("members_tail");
    g.add_alternative(members_tail, {});
    g.add_alternative(members_tail, cat({ref(w), lit(","), ref(w), ref(member), ref(members_tail)}));
    const uint32_t object =
        g.rule_of({cat({lit("{"), ref(w), lit("}")}),
                   cat({lit("{"), ref(w), ref(member), ref(members_tail), ref(w), lit("}")})},
                  "object");
    const uint32_t items_tail = g.add_rule("items_tail");
    g.add_alternative(items_tail, {});
    g.add_alternative(items_tail, cat({ref(w), lit(","), ref(w), ref(value), ref(items_tail)}));
    const uint32_t array = g.rule_of({cat({lit("["), ref(w), lit("]")}),
                                      cat({lit("["), ref(w), ref(value), ref(items_tail), ref(w), lit("]")})},
                                     "array");
    for (const Seq& alt : std::vector<Seq>{ref(object), ref(array), ref(str), ref(number()), lit("true"),
                                           lit("false"), lit("null")})
      g.add_alternative(value, alt);
    return value;
  }

  uint32_t literal_values(const json& values) {
    std::vector<Seq> alts;
    for (const auto& v : values) alts.push_back(lit(v.dump(-1, ' ', false, json::error_handler_t::strict)));
    return g.rule_of(alts);
  }

  uint32_t resolve_ref(const std::string& target, const std::string& path) {
    if (auto it = refs.find(target); it != refs.end()) return it->second;
    const json* node = nullptr;
    if (target == "#") {
      node = &root;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (target.rfind(p, 0) != 0) continue;
        const std::string section = p.substr(2, p.size() - 3);
        const std::string name = target.substr(p.size());
        if (root.contains(section) && root[section].is_object() && root[section].contains(name))
          node = &root[section][name];
      }
    }
    if (!node)
      throw SchemaError("'$ref' at " + path + " points to '" + target +
                        "', which is not in this schema's $defs");
    // The rule exists before its body, so recursive references close the loop.
    const uint32_t r = g.add_rule("ref:" + target);
    refs[target] = r;
    g.add_alternative(r, ref(value(*node, target)));
    return r;
  }

  uint32_t object(const json& s, const std::string& path) {
    const uint32_t w = ws();
    std::vector<std::pair<std::string, const json*>> props;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) throw SchemaError("'properties' at " + path + " must be an object");
      for (auto p = it->begin(); p != it->end(); ++p) props.emplace_back(p.key(), &p.value());
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) throw SchemaError("'required' at " + path + " must be an array");
      for (const auto& r : *it) {
        if (!r.is_string()) throw SchemaError("'required' at " + path + " must hold strings");
        required.insert(r.get<std::string>());
      }
    }
    for (const auto& r : required)
      if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r; }))
        throw SchemaError("'required' at " + path + " names '" + r + "', which is not in 'properties'");
    const json* additional = nullptr;
    bool additional_allowed = true;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean())
        additional_allowed = it->get<bool>();
      else if (it->is_object())
        additional = &*it;
      else
        throw SchemaError("'additionalProperties' at " + path + " must be a boolean or a schema");
    }
    if (props.empty()) {
      if (!additional_allowed) return g.rule_of({cat({lit("{"), ref(w), lit("}")})});
      // Any keys; values per additionalProperties.
      const uint32_t val = additional ? value(*additional, path + "/additionalProperties") : any_value();
      const uint32_t str = string(std::nullopt, std::nullopt, path);
      const uint32_t member = g.rule_of({cat({ref(str), ref(w), lit(":"), ref(w), ref(val)})});
      const uint32_t tail = g.add_rule();
      g.add_alternative(tail, {});
      g.add_alternative(tail, cat({ref(w), lit(","), ref(w), ref(member), ref(tail)}));
      return g.rule_of({cat({lit("{"), ref(w), lit("}")}),
                        cat({lit("{"), ref(w), ref(member), ref(tail), ref(w), lit("}")})});
    }
    // rest[i][first]: properties i.. given whether none was written yet.
    const size_t n = props.size();
    std::vector<std::array<uint32_t, 2>> rest(n + 1);
    rest[n] = {g.rule_of({{}}), g.rule_of({{}})};
    for (size_t i = n; i-- > 0;) {
      const auto& [name, schema] = props[i];
      const uint32_t val = value(*schema, path + "/properties/" + name);
      const Seq key = lit(json(name).dump(-1, ' ', false, json::error_handler_t::strict));
      for (int first = 0; first < 2; ++first) {
        std::vector<Seq> alts;
        Seq present = first ? Seq{} : cat({ref(w), lit(","), ref(w)});
        present = cat({present, key, ref(w), lit(":"), ref(w), ref(val), ref(rest[i + 1][0])});
        alts.push_back(present);
        if (!required.count(name)) alts.push_back(ref(rest[i + 1][first]));
        rest[i][first] = g.rule_of(alts);
      }
      check_size();
    }
    return g.rule_of({cat({lit("{"), ref(w), ref(rest[0][1]), ref(w), lit("}")})});
  }

  // Arrays: prefixItems (2020-12 tuples; or draft-7 `items` as an array with additionalItems)
  // give the leading items, `items` (or additionalItems) the rest: a schema, true, or false (none).
  uint32_t array(const json& s, const std::string& path) {
    const uint32_t w = ws();
    std::vector<uint32_t> prefix;
    std::optional<uint32_t> rest;  // nullopt: no items after the prefix
    auto items_after = [&](const char* key) {
      auto it = s.find(key);
      if (it == s.end() || (it->is_boolean() && it->get<bool>())) return std::optional<uint32_t>(any_value());
      if (it->is_boolean()) return std::optional<uint32_t>();
      return std::optional<uint32_t>(value(*it, path + "/" + key));
    };
    auto tuple = [&](const json& list, const char* key) {
      for (size_t i = 0; i < list.size(); ++i)
        prefix.push_back(value(list[i], path + "/" + key + "/" + std::to_string(i)));
    };
    if (auto it = s.find("prefixItems"); it != s.end()) {
      if (!it->is_array()) throw SchemaError("'prefixItems' at " + path + " must be an array");
      if (s.contains("additionalItems"))
        throw SchemaError("'additionalItems' with 'prefixItems' at " + path +
                          " is not supported (use 'items')");
      tuple(*it, "prefixItems");
      rest = items_after("items");
    } else if (auto items = s.find("items"); items != s.end() && items->is_array()) {
      tuple(*items, "items");
      rest = items_after("additionalItems");
    } else {
      if (s.contains("additionalItems"))
        throw SchemaError("'additionalItems' without a tuple at " + path + " is not supported");
      rest = items_after("items");
    }
    auto count = [&](const char* key) -> std::optional<int64_t> {
      auto it = s.find(key);
      if (it == s.end()) return std::nullopt;
      if (!it->is_number_integer() || it->get<int64_t>() < 0)
        throw SchemaError("'" + std::string(key) + "' at " + path + " must be a non-negative integer");
      return it->get<int64_t>();
    };
    const int64_t k = static_cast<int64_t>(prefix.size());
    const int64_t lo = count("minItems").value_or(0);
    std::optional<int64_t> hi = count("maxItems");
    if (hi && *hi < lo) throw SchemaError("maxItems < minItems at " + path);
    if (lo > limits.max_repeat_bound || (hi && *hi > limits.max_repeat_bound))
      throw SchemaError("minItems/maxItems above " + std::to_string(limits.max_repeat_bound) + " at " + path +
                        " is not supported");
    if (!rest) {
      hi = hi ? std::min(*hi, k) : k;
      if (lo > *hi)
        throw SchemaError("minItems " + std::to_string(lo) + " at " + path + " exceeds the " +
                          std::to_string(k) + " items the tuple allows");
    }
    const uint32_t empty = g.rule_of({cat({lit("["), ref(w), lit("]")})});
    if (hi && *hi == 0) return empty;
    auto item = [&](int64_t i) { return i < k ? prefix[static_cast<size_t>(i)] : *rest; };
    // after[i]: the rest of the array once i >= 1 items are written. Positions from `same`
    // on all look alike (past the tuple and minItems), so an unbounded array loops there.
    const int64_t same = std::max(k, lo);
    const int64_t top = hi ? *hi : std::max<int64_t>(same, 1);
    std::vector<uint32_t> after(static_cast<size_t>(top + 1));
    if (hi) {
      after[static_cast<size_t>(top)] = g.rule_of({{}});
    } else {
      const uint32_t loop = g.add_rule();
      g.add_alternative(loop, {});
      g.add_alternative(loop, cat({ref(w), lit(","), ref(w), ref(*rest), ref(loop)}));
      after[static_cast<size_t>(top)] = loop;
    }
    for (int64_t i = top - 1; i >= 1; --i) {
      std::vector<Seq> alts;
      if (i >= lo) alts.push_back({});
      alts.push_back(cat({ref(w), lit(","), ref(w), ref(item(i)), ref(after[static_cast<size_t>(i + 1)])}));
      after[static_cast<size_t>(i)] = g.rule_of(alts);
      check_size();
    }
    std::vector<Seq> alts{cat({lit("["), ref(w), ref(item(0)), ref(after[1]), ref(w), lit("]")})};
    if (lo == 0) alts.push_back(ref(empty));
    check_size();
    return g.rule_of(alts);
  }

  uint32_t typed(const std::string& type, const json& s, const std::string& path) {
    if (type == "object") return object(s, path);
    if (type == "array") return array(s, path);
    if (type == "boolean") return g.rule_of({lit("true"), lit("false")});
    if (type == "null") return g.rule_of({lit("null")});
    if (type == "integer") return integer(s, path);
    if (type == "number") return bounded_number(s, path);
    if (type == "string") {
      if (auto p = s.find("pattern"); p != s.end()) {
        if (!p->is_string()) throw SchemaError("'pattern' at " + path + " must be a string");
        for (const char* other : {"format", "minLength", "maxLength"})
          if (s.contains(other))
            throw SchemaError("'pattern' with '" + std::string(other) + "' at " + path + " is not supported");
        try {
          const uint32_t body =
              pattern_rule(g, p->get<std::string>(), chars(), PatternLimits{limits.max_repeat_bound},
                           [this] { check_size(); });
          return g.rule_of({cat({lit("\""), ref(body), lit("\"")})});
        } catch (const PatternError& e) {
          throw SchemaError(std::string(e.what()) + " (at " + path + ")");
        }
      }
      if (auto f = s.find("format"); f != s.end()) {
        if (!f->is_string()) throw SchemaError("'format' at " + path + " must be a string");
        if (s.contains("minLength") || s.contains("maxLength"))
          throw SchemaError("'format' with minLength/maxLength at " + path + " is not supported");
        return formatted_string(f->get<std::string>(), path);
      }
      auto len = [&](const char* key) -> std::optional<int64_t> {
        auto it = s.find(key);
        if (it == s.end()) return std::nullopt;
        if (!it->is_number_integer())
          throw SchemaError("'" + std::string(key) + "' at " + path + " must be an integer");
        return it->get<int64_t>();
      };
      return string(len("minLength"), len("maxLength"), path);
    }
    throw SchemaError("unknown type '" + type + "' at " + path);
  }

  // What is known of the values a schema admits, to prove oneOf's branches exclusive: the JSON
  // types (an integer-valued number is of both "integer" and "number"), the enumerated values
  // (const / enum), and the required properties whose values are enumerated (discriminators).
  enum TypeBit : unsigned {
    kObject = 1,
    kArray = 2,
    kString = 4,
    kInteger = 8,
    kFraction = 16,
    kBool = 32,
    kNull = 64
  };
  struct Admits {
    unsigned types = 127;
    std::optional<std::vector<json>> values;
    std::map<std::string, std::vector<json>> tags;
  };
  static unsigned type_bits(const std::string& t) {
    if (t == "object") return kObject;
    if (t == "array") return kArray;
    if (t == "string") return kString;
    if (t == "integer") return kInteger;
    if (t == "number") return kInteger | kFraction;
    if (t == "boolean") return kBool;
    if (t == "null") return kNull;
    return 127;
  }
  static unsigned value_bits(const json& v) {
    if (v.is_object()) return kObject;
    if (v.is_array()) return kArray;
    if (v.is_string()) return kString;
    if (v.is_boolean()) return kBool;
    if (v.is_null()) return kNull;
    if (v.is_number_integer() || v.is_number_unsigned()) return kInteger;
    const double d = v.get<double>();
    return std::floor(d) == d ? kInteger : kFraction;
  }
  static std::optional<std::vector<json>> enumerated(const json& s) {
    if (!s.is_object()) return std::nullopt;
    if (auto it = s.find("const"); it != s.end()) return std::vector<json>{*it};
    if (auto it = s.find("enum"); it != s.end() && it->is_array())
      return std::vector<json>(it->begin(), it->end());
    return std::nullopt;
  }
  const json* ref_target(const std::string& target) const {
    if (target == "#") return &root;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string p = prefix;
      if (target.rfind(p, 0) != 0) continue;
      const std::string section = p.substr(2, p.size() - 3), name = target.substr(p.size());
      if (root.contains(section) && root[section].is_object() && root[section].contains(name))
        return &root[section][name];
    }
    return nullptr;
  }
  Admits admits(const json& s, int depth) const {
    Admits a;
    if (!s.is_object() || depth > 16) return a;
    if (auto it = s.find("$ref"); it != s.end() && it->is_string()) {
      const json* target = ref_target(it->get<std::string>());
      return target ? admits(*target, depth + 1) : a;
    }
    if (auto values = enumerated(s)) {
      a.types = 0;
      for (const auto& v : *values) a.types |= value_bits(v);
      a.values = std::move(values);
      return a;
    }
    for (const char* key : {"anyOf", "oneOf"})
      if (auto it = s.find(key); it != s.end() && it->is_array()) {
        a.types = 0;
        for (const auto& b : *it) a.types |= admits(b, depth + 1).types;
        return a;
      }
    if (auto it = s.find("allOf"); it != s.end() && it->is_array() && it->size() == 1)
      return admits((*it)[0], depth + 1);
    if (auto it = s.find("type"); it != s.end()) {
      a.types = 0;
      if (it->is_string())
        a.types = type_bits(it->get<std::string>());
      else if (it->is_array())
        for (const auto& t : *it) a.types |= t.is_string() ? type_bits(t.get<std::string>()) : 127;
      if (s.value("nullable", false)) a.types |= kNull;
    }
    if (auto props = s.find("properties"); props != s.end() && props->is_object())
      if (auto req = s.find("required"); req != s.end() && req->is_array())
        for (const auto& r : *req)
          if (r.is_string() && props->contains(r.get<std::string>()))
            if (auto values = enumerated((*props)[r.get<std::string>()]))
              a.tags[r.get<std::string>()] = *values;
    return a;
  }
  static bool share_a_value(const std::vector<json>& x, const std::vector<json>& y) {
    for (const auto& v : x)
      for (const auto& w : y)
        if (v == w) return true;
    return false;
  }
  // True when no JSON value can validate against both.
  static bool exclusive(const Admits& a, const Admits& b) {
    if ((a.types & b.types) == 0) return true;
    if (a.values && b.values) return !share_a_value(*a.values, *b.values);
    if (a.types == kObject && b.types == kObject)
      for (const auto& [name, values] : a.tags)
        if (auto it = b.tags.find(name); it != b.tags.end() && !share_a_value(values, it->second))
          return true;
    return false;
  }

  uint32_t value(const json& s, const std::string& path) {
    check_size();
    if (s.is_boolean()) {
      if (!s.get<bool>()) throw SchemaError("schema false at " + path + " admits no value");
      return any_value();
    }
    if (!s.is_object()) throw SchemaError("the schema at " + path + " must be an object or a boolean");
    // Which keywords may appear: those of the types it can have.
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string())
        types.push_back(it->get<std::string>());
      else if (it->is_array())
        for (const auto& t : *it) {
          if (!t.is_string())
            throw SchemaError("'type' at " + path + " must be a string or an array of strings");
          types.push_back(t.get<std::string>());
        }
      else
        throw SchemaError("'type' at " + path + " must be a string or an array of strings");
      for (const auto& t : types)
        if (!kByType.count(t)) throw SchemaError("unknown type '" + t + "' at " + path);
    }
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& k = it.key();
      if (kAnnotations.count(k) || kCommon.count(k)) continue;
      bool known = false;
      for (const auto& [t, keys] : kByType)
        if ((types.empty() || std::find(types.begin(), types.end(), t) != types.end()) && keys.count(k))
          known = true;
      if (!known) throw SchemaError("unsupported keyword '" + k + "' at " + path);
    }
    if (s.value("nullable", false) && !types.empty() &&
        std::find(types.begin(), types.end(), "null") == types.end())
      types.push_back("null");
    if (auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) throw SchemaError("'$ref' at " + path + " must be a string");
      for (auto k = s.begin(); k != s.end(); ++k)
        if (!kAnnotations.count(k.key()) && k.key() != "$ref" && k.key() != "$defs" &&
            k.key() != "definitions")
          throw SchemaError("'$ref' with '" + k.key() + "' beside it at " + path + " is not supported");
      return resolve_ref(it->get<std::string>(), path);
    }
    if (auto it = s.find("const"); it != s.end()) return literal_values(json::array({*it}));
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty())
        throw SchemaError("'enum' at " + path + " must be a non-empty array");
      return literal_values(*it);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      if (!it->is_array() || it->empty())
        throw SchemaError("'" + std::string(key) + "' at " + path + " must be a non-empty array");
      if (!types.empty())
        throw SchemaError("'" + std::string(key) + "' with 'type' beside it at " + path +
                          " is not supported");
      if (std::string(key) == "oneOf") {
        // Exactly one branch must match. Generated as anyOf, which is the same language when no
        // value can match two branches; anything else is refused rather than generated wrong.
        std::vector<Admits> branches;
        for (const auto& b : *it) branches.push_back(admits(b, 0));
        for (size_t i = 0; i < branches.size(); ++i)
          for (size_t j = i + 1; j < branches.size(); ++j)
            if (!exclusive(branches[i], branches[j]))
              throw SchemaError(
                  "'oneOf' at " + path + ": branches " + std::to_string(i) + " and " + std::to_string(j) +
                  " may both match, which is not supported (supported: branches of different types, "
                  "different const/enum values, or objects with a required property of different "
                  "const values); use anyOf");
      }
      std::vector<Seq> alts;
      for (size_t i = 0; i < it->size(); ++i)
        alts.push_back(ref(value((*it)[i], path + "/" + key + "/" + std::to_string(i))));
      return g.rule_of(alts);
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1)
        throw SchemaError("'allOf' at " + path + " is supported with exactly one member");
      return value((*it)[0], path + "/allOf/0");
    }
    if (types.empty()) {  // inferred from the keywords, else any value
      if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties"))
        types = {"object"};
      else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
               s.contains("maxItems"))
        types = {"array"};
      else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") ||
               s.contains("format"))
        types = {"string"};
      else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum") || s.contains("multipleOf"))
        types = {"number"};
      else
        return any_value();
    }
    if (types.size() == 1) return typed(types[0], s, path);
    std::vector<Seq> alts;
    for (const auto& t : types) alts.push_back(ref(typed(t, s, path)));
    return g.rule_of(alts);
  }
};

JsonSchemaCompiler::JsonSchemaCompiler(Grammar& g, const json& root_schema, JsonGrammarLimits limits)
    : impl_(std::make_unique<Impl>(g, root_schema, limits)) {}
JsonSchemaCompiler::~JsonSchemaCompiler() = default;
uint32_t JsonSchemaCompiler::value(const json& schema, const std::string& path) {
  return impl_->value(schema, path);
}
uint32_t JsonSchemaCompiler::ws() { return impl_->ws(); }

Grammar json_schema_grammar(const json& schema, const JsonGrammarLimits& limits) {
  if (schema.dump().size() > limits.max_schema_bytes)
    throw SchemaError("schema too large: more than " + std::to_string(limits.max_schema_bytes) + " bytes");
  Grammar g;
  JsonSchemaCompiler c(g, schema, limits);
  const uint32_t value = c.value(schema, "#");
  g.set_root(g.rule_of({{Element::rule(value)}}, "root"));
  g.validate();
  return g;
}

Grammar json_object_grammar() { return json_schema_grammar(json{{"type", "object"}}); }

}  // namespace swarm::grammar
