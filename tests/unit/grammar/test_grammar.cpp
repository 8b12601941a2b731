// Byte grammars, the incremental matcher and JSON Schema -> grammar.
#include <gtest/gtest.h>

#include <cstdio>

#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.hpp"
#include "grammar/grammar_cache.hpp"
#include "grammar/json_schema_grammar.hpp"
#include "grammar/numeric_grammar.hpp"
#include "grammar/token_mask.hpp"
#include "support/random_schema.hpp"

namespace swarm::grammar {
namespace {

using ojson = nlohmann::ordered_json;

bool accepts(const Grammar& g, const std::string& text) {
  Matcher m(g);
  return m.feed_bytes(text) && m.accepting();
}
bool prefix_ok(const Grammar& g, const std::string& text) {
  Matcher m(g);
  return m.feed_bytes(text);
}

TEST(Grammar, LiteralsAlternativesAndRightRecursion) {
  Grammar g;
  // list ::= "a" | "a" "," list   (one or more a's separated by commas)
  const uint32_t list = g.add_rule("list");
  g.add_alternative(list, Grammar::literal("a"));
  g.add_alternative(list, {Element::byte('a'), Element::byte(','), Element::rule(list)});
  g.set_root(list);
  EXPECT_TRUE(accepts(g, "a"));
  EXPECT_TRUE(accepts(g, "a,a,a"));
  EXPECT_FALSE(accepts(g, "a,"));  // a prefix, not a sentence
  EXPECT_TRUE(prefix_ok(g, "a,"));
  EXPECT_FALSE(prefix_ok(g, "a,,"));
  EXPECT_FALSE(prefix_ok(g, "b"));
  Matcher m(g);
  ASSERT_TRUE(m.feed_bytes("a"));
  EXPECT_TRUE(m.accepting());
  EXPECT_FALSE(m.finished());  // ",a" may still follow
  EXPECT_FALSE(m.feed_byte('x'));
  EXPECT_TRUE(m.accepting()) << "a refused byte leaves the state as it was";
}

TEST(Grammar, EmptyAlternativesAndByteRanges) {
  Grammar g;
  const uint32_t digits = g.add_rule();
  g.add_alternative(digits, {});
  g.add_alternative(digits, {Element::bytes('0', '9'), Element::rule(digits)});
  g.set_root(g.rule_of({{Element::byte('#'), Element::rule(digits), Element::byte(';')}}));
  EXPECT_TRUE(accepts(g, "#;"));
  EXPECT_TRUE(accepts(g, "#0123456789;"));
  EXPECT_FALSE(accepts(g, "#12a;"));
  Matcher m(g);
  ASSERT_TRUE(m.feed_bytes("#1;"));
  EXPECT_TRUE(m.finished());
}

TEST(Grammar, SpecialTokensMatchOnlyAsTokens) {
  Grammar g;
  g.set_root(g.rule_of({{Element::token(7), Element::byte('x'), Element::token(8)}}));
  Matcher m(g);
  EXPECT_EQ(m.allowed_special_tokens(m.state()), std::vector<uint32_t>{7});
  EXPECT_FALSE(m.feed_bytes("<tool_call>"));
  EXPECT_FALSE(m.feed_token(8));
  ASSERT_TRUE(m.feed_token(7));
  ASSERT_TRUE(m.feed_byte('x'));
  EXPECT_EQ(m.allowed_special_tokens(m.state()), std::vector<uint32_t>{8});
  ASSERT_TRUE(m.feed_token(8));
  EXPECT_TRUE(m.finished());
}

TEST(Grammar, InvalidGrammarsAreRefused) {
  Grammar g;
  const uint32_t r = g.add_rule("empty");
  g.set_root(r);
  EXPECT_THROW(Matcher{g}, std::invalid_argument);
  Grammar left;
  const uint32_t l = left.add_rule("left");
  left.add_alternative(l, {Element::rule(l), Element::byte('a')});
  left.set_root(l);
  EXPECT_THROW(Matcher{left}, std::logic_error);
}

// ------------------------------------------------------------------------------ JSON Schema

Grammar schema_grammar(const std::string& schema) { return json_schema_grammar(ojson::parse(schema)); }

TEST(JsonSchemaGrammar, ObjectsFollowTheSchemaOrderRequiredAndOptional) {
  const Grammar g = schema_grammar(R"({
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age"], "additionalProperties": false})");
  EXPECT_TRUE(accepts(g, R"({"name":"Ann","age":31})"));
  EXPECT_TRUE(accepts(g, R"({"name": "Ann", "age": -4, "tags": ["a", "b"]})"));
  EXPECT_TRUE(accepts(g, "{\n  \"name\": \"A\\u00e9\\n\",\n  \"age\": 0\n}"));
  EXPECT_TRUE(accepts(g, R"({"name":"日本語","age":7,"tags":[]})"));
  EXPECT_FALSE(accepts(g, R"({"age":31,"name":"Ann"})")) << "schema order";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann"})")) << "age is required";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","age":31,"x":1})")) << "no additional properties";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","age":3.5})")) << "integer";
  EXPECT_FALSE(accepts(g, R"({"name":"Ann","age":01})")) << "no leading zeros";
  EXPECT_FALSE(accepts(g, "{\"name\":\"a\x01\",\"age\":1}")) << "control characters are escaped in JSON";
  EXPECT_FALSE(prefix_ok(g, "{\"name\":\"\xff")) << "invalid UTF-8";
  EXPECT_FALSE(prefix_ok(g, "{         ")) << "whitespace is bounded";
}

TEST(JsonSchemaGrammar, ScalarsEnumsConstAndUnions) {
  const Grammar g = schema_grammar(R"({"type": "object", "properties": {
      "kind": {"enum": ["a", "b\"c", 3, null]},
      "fixed": {"const": {"k": [1, true]}},
      "either": {"anyOf": [{"type": "boolean"}, {"type": "number"}]},
      "maybe": {"type": ["string", "null"]},
      "opt": {"type": "string", "nullable": true}},
    "required": ["kind", "fixed", "either", "maybe", "opt"]})");
  EXPECT_TRUE(
      accepts(g, R"({"kind":"b\"c","fixed":{"k":[1,true]},"either":-1.5e+3,"maybe":null,"opt":"x"})"));
  EXPECT_TRUE(accepts(g, R"({"kind":3,"fixed":{"k":[1,true]},"either":false,"maybe":"s","opt":null})"));
  EXPECT_FALSE(accepts(g, R"({"kind":"c","fixed":{"k":[1,true]},"either":false,"maybe":"s","opt":null})"));
  EXPECT_FALSE(accepts(g, R"({"kind":3,"fixed":{"k":[1, true]},"either":false,"maybe":"s","opt":null})"))
      << "const is matched as its compact serialization";
  EXPECT_FALSE(accepts(g, R"({"kind":3,"fixed":{"k":[1,true]},"either":"x","maybe":"s","opt":null})"));
}

// oneOf is generated only when no value can match two branches (then it is anyOf's language):
// branches of different types, different enumerated values, or tagged objects (pydantic's
// discriminated unions, $refs and `discriminator` included); an overlapping oneOf is a 400.
TEST(JsonSchemaGrammar, OneOfOnlyWithExclusiveBranches) {
  const Grammar g = schema_grammar(R"({"type": "object", "properties": {
      "pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
              "discriminator": {"propertyName": "kind", "mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}}},
      "n": {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
      "e": {"oneOf": [{"enum": [1, 2]}, {"const": 3}, {"type": "string"}]}},
    "required": ["pet", "n", "e"],
    "$defs": {"Cat": {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind"]},
              "Dog": {"type": "object", "properties": {"kind": {"type": "string", "enum": ["dog"]}}, "required": ["kind"]}}})");
  EXPECT_TRUE(accepts(g, R"({"pet":{"kind":"cat","lives":9},"n":null,"e":3})"));
  EXPECT_TRUE(accepts(g, R"({"pet":{"kind":"dog"},"n":"x","e":"s"})"));
  EXPECT_FALSE(accepts(g, R"({"pet":{"kind":"dog","lives":9},"n":"x","e":"s"})"));
  auto refused = [](const char* schema) {
    try {
      json_schema_grammar(ojson::parse(schema));
    } catch (const SchemaError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (
      const char* overlapping :
      {R"({"oneOf": [{"type": "number"}, {"type": "integer"}]})",
       R"({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 3}]})",
       R"({"oneOf": [{"enum": [1, 2]}, {"enum": [2, 3]}]})",
       R"({"oneOf": [{"type": "object"}, {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]}]})",
       R"({"oneOf": [{"const": 1}, {"type": "integer"}]})"}) {
    const std::string what = refused(overlapping);
    EXPECT_NE(what.find("'oneOf' at #: branches"), std::string::npos) << overlapping << ": " << what;
  }
}

TEST(JsonSchemaGrammar, LengthsCountsAndIntegerBounds) {
  const Grammar s = schema_grammar(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(accepts(s, R"("a")"));
  EXPECT_TRUE(accepts(s, R"("ab")"));
  EXPECT_TRUE(accepts(s, R"("a\nc")")) << "an escape is one character";
  EXPECT_TRUE(accepts(s, R"("äöü")")) << "characters, not bytes";
  EXPECT_FALSE(accepts(s, R"("abcd")"));
  const Grammar a =
      schema_grammar(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2})");
  EXPECT_FALSE(accepts(a, "[]"));
  EXPECT_TRUE(accepts(a, "[1]"));
  EXPECT_TRUE(accepts(a, "[1, 2]"));
  EXPECT_FALSE(accepts(a, "[1,2,3]"));
  const Grammar i = schema_grammar(R"({"type": "integer", "minimum": -12, "maximum": 305})");
  for (int v = -30; v <= 400; ++v) EXPECT_EQ(accepts(i, std::to_string(v)), v >= -12 && v <= 305) << v;
  const Grammar e = schema_grammar(R"({"type": "integer", "exclusiveMinimum": 0})");
  EXPECT_FALSE(accepts(e, "0"));
  EXPECT_FALSE(accepts(e, "-1"));
  EXPECT_TRUE(accepts(e, "1"));
  EXPECT_TRUE(accepts(e, "123456789012"));
  const Grammar neg = schema_grammar(R"({"type": "integer", "maximum": -100})");
  EXPECT_TRUE(accepts(neg, "-100"));
  EXPECT_TRUE(accepts(neg, "-99999"));
  EXPECT_FALSE(accepts(neg, "-99"));
  EXPECT_FALSE(accepts(neg, "5"));
}

TEST(JsonSchemaGrammar, BoundedNumbersAreExactAtTheBounds) {
  const Grammar g = schema_grammar(R"({"type": "number", "minimum": 0, "maximum": 100})");
  for (const char* ok : {"100", "99.5", "1e2", "1E+2", "10e1", "0.1e3", "1000e-1", "100.000", "0", "-0",
                         "0.0", "-0.0e5", "0e99", "5e-99", "42", "0.000000000000001", "99.9999999999999"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"100.01", "100.0000000000001", "1e3", "1.01e2", "-1", "-0.5", "-1e-99", "101",
                          "1e100", "100000", "1.0000000000000001"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
  const Grammar open =
      schema_grammar(R"({"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 0.25})");
  for (const char* ok : {"-2.49", "-2.4999", "0", "0.2499", "-25e-99"}) EXPECT_TRUE(accepts(open, ok)) << ok;
  EXPECT_FALSE(accepts(open, "-25e-100")) << "a 3-digit exponent is outside the language";
  for (const char* bad : {"-2.5", "-25e-1", "0.25", "2.5e-1", "0.250", "-2.50000000000001", "1"})
    EXPECT_FALSE(accepts(open, bad)) << bad;
  // A schema a zod .positive() writes, and pydantic's Field(gt=0, le=1).
  const Grammar positive = schema_grammar(R"({"type": "number", "exclusiveMinimum": 0})");
  EXPECT_TRUE(accepts(positive, "1e-99"));
  EXPECT_TRUE(accepts(positive, "123456789012345e99"));
  EXPECT_FALSE(accepts(positive, "0"));
  EXPECT_FALSE(accepts(positive, "0.000e5"));
  EXPECT_FALSE(accepts(positive, "-0.1"));
  const Grammar ints =
      schema_grammar(R"({"type": "integer", "minimum": -12, "maximum": 305, "multipleOf": 5})");
  for (int v = -30; v <= 400; ++v)
    EXPECT_EQ(accepts(ints, std::to_string(v)), v >= -12 && v <= 305 && v % 5 == 0) << v;
  const Grammar halves = schema_grammar(R"({"type": "integer", "multipleOf": 0.5, "exclusiveMinimum": 2.5})");
  EXPECT_TRUE(accepts(halves, "3")) << "every integer is a multiple of 0.5";
  EXPECT_FALSE(accepts(halves, "2"));
  const Grammar sevens = schema_grammar(R"({"type": "integer", "multipleOf": 0.7})");
  EXPECT_TRUE(accepts(sevens, "-7"));
  EXPECT_TRUE(accepts(sevens, "700000000000000007"));
  EXPECT_FALSE(accepts(sevens, "10"));
}

// Every text of many kinds (random, and spellings right at and beside each bound) is decided by
// the grammar; tests/reference/check_number_grammar.py decides each one again with Python's
// decimal module and checks the two agree both ways.
std::string plain(const Decimal& d) {
  const std::string ip = d.int_part(), fp = d.frac_part();
  return std::string(d.negative ? "-" : "") + (ip.empty() ? "0" : ip) + (fp.empty() ? "" : "." + fp);
}

std::vector<std::string> spellings_near(const Decimal& b, std::mt19937_64& rng) {
  std::vector<std::string> out;
  for (int shift = -3; shift <= 3; ++shift) {
    const std::string m = plain(b.shifted(-shift));
    out.push_back(shift == 0 ? m : m + (rng() % 2 ? "e" : "E") + std::to_string(shift));
    // Just above and just below (in magnitude) at a few depths.
    for (int extra = 1; extra <= 16; extra += 5) {
      std::string up = m.find('.') == std::string::npos ? m + "." : m;
      up += std::string(static_cast<size_t>(extra - 1), '0') + "1";
      out.push_back(shift == 0 ? up : up + "e" + std::to_string(shift));
      std::string down = m;
      const size_t last = down.find_last_of("123456789");
      if (last != std::string::npos) {
        down[last] = static_cast<char>(down[last] - 1);
        if (down.find('.') == std::string::npos) down += ".";
        down += std::string(static_cast<size_t>(extra), '9');
        out.push_back(shift == 0 ? down : down + "e" + std::to_string(shift));
      }
    }
  }
  return out;
}

std::string random_number_text(std::mt19937_64& rng, bool integer) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  std::string t = pick(4) == 0 ? "-" : "";
  const int int_len = pick(3) == 0 ? 0 : 1 + pick(integer ? 20 : 17);
  if (int_len == 0) {
    t += "0";
  } else {
    t += static_cast<char>('1' + pick(9));
    for (int i = 1; i < int_len; ++i) t += static_cast<char>('0' + pick(10));
  }
  if (integer) return t;
  if (pick(2)) {
    t += ".";
    const int n = 1 + pick(pick(4) == 0 ? 18 : 4);
    for (int i = 0; i < n; ++i) t += static_cast<char>('0' + pick(pick(3) == 0 ? 1 : 10));
  }
  if (pick(3) == 0) {
    t += pick(2) ? "e" : "E";
    const int sign = pick(3);
    if (sign == 1) t += "+";
    if (sign == 2) t += "-";
    const int n = 1 + pick(pick(8) == 0 ? 3 : 2);
    for (int i = 0; i < n; ++i) t += static_cast<char>('0' + pick(10));
  }
  return t;
}

TEST(JsonSchemaGrammar, BoundedNumbersMatchAnIndependentDecimalReference) {
  const char* schemas[] = {
      R"({"type": "number", "minimum": 0, "maximum": 100})",
      R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})",
      R"({"type": "number", "minimum": -2.5, "maximum": 2.5})",
      R"({"type": "number", "minimum": 0.001})",
      R"({"type": "number", "maximum": -1e-05})",
      R"({"type": "number", "exclusiveMaximum": 1e20, "minimum": -3})",
      R"({"type": "number", "minimum": 123.456, "exclusiveMaximum": 123.5})",
      R"({"type": "number", "minimum": -100, "exclusiveMaximum": 0})",
      R"({"type": "number", "exclusiveMinimum": -0.5})",
      R"({"type": "number", "minimum": 1e-20, "maximum": 3e-20})",
      R"({"type": "number", "minimum": 0, "maximum": 0})",
      R"({"type": "number", "minimum": 0.1, "maximum": 0.30000000000000004, "exclusiveMinimum": 0.1})",
      R"({"type": "number", "minimum": -1e30, "maximum": 98765432109876.5})",
      R"({"type": "integer", "minimum": -12, "maximum": 305, "multipleOf": 5})",
      R"({"type": "integer", "multipleOf": 7, "minimum": 0})",
      R"({"type": "integer", "exclusiveMinimum": 2.5, "maximum": 1000, "multipleOf": 0.5})",
      R"({"type": "integer", "multipleOf": 12, "maximum": -1})",
      R"({"type": "integer", "minimum": -1e25, "exclusiveMaximum": 12345678901234567890})",
  };
  std::mt19937_64 rng(20261207);
  const std::string path = ::testing::TempDir() + "swarm_number_texts.jsonl";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  int written = 0, accepted = 0;
  for (const char* text : schemas) {
    const ojson schema = ojson::parse(text);
    const bool integer = schema["type"] == "integer";
    const Grammar g = json_schema_grammar(schema);
    std::vector<std::string> texts;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
      if (schema.contains(key))
        for (std::string t : spellings_near(Decimal::parse(schema[key].dump()), rng))
          texts.push_back(integer ? t.substr(0, t.find_first_of(".eE")) : t);
    for (int i = 0; i < 3000; ++i) texts.push_back(random_number_text(rng, integer));
    for (const std::string& t : texts) {
      const bool ok = accepts(g, t);
      accepted += ok;
      const std::string line =
          nlohmann::json{{"schema", schema}, {"text", t}, {"accepted", ok}}.dump() + "\n";
      std::fwrite(line.data(), 1, line.size(), f);
      ++written;
    }
  }
  std::fclose(f);
  EXPECT_GT(accepted, written / 10) << "the texts should exercise both sides";
  const auto [rc, output] = swarm::testing::run_reference("check_number_grammar.py", path);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("ok: " + std::to_string(written) + " texts"), std::string::npos) << output;
}

TEST(JsonSchemaGrammar, TuplesWithPrefixItems) {
  // What pydantic writes for tuple[int, str].
  const Grammar pair =
      schema_grammar(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
      "minItems": 2, "maxItems": 2})");
  EXPECT_TRUE(accepts(pair, R"([1, "a"])"));
  EXPECT_FALSE(accepts(pair, R"(["a", 1])"));
  EXPECT_FALSE(accepts(pair, "[1]"));
  EXPECT_FALSE(accepts(pair, R"([1, "a", 2])"));
  // tuple[int, ...] style: a prefix, then any number of booleans; a partial prefix is allowed.
  const Grammar open = schema_grammar(
      R"({"type": "array", "prefixItems": [{"type": "integer"}, {"const": "x"}], "items": {"type": "boolean"}})");
  for (const char* ok : {"[]", "[1]", R"([1, "x"])", R"([1, "x", true, false])"})
    EXPECT_TRUE(accepts(open, ok)) << ok;
  for (const char* bad : {R"(["x"])", "[1, true]", R"([1, "x", 3])"}) EXPECT_FALSE(accepts(open, bad)) << bad;
  const Grammar closed = schema_grammar(R"({"prefixItems": [{"type": "null"}], "items": false})");
  EXPECT_TRUE(accepts(closed, "[null]"));
  EXPECT_TRUE(accepts(closed, "[]"));
  EXPECT_FALSE(accepts(closed, "[null, null]"));
  EXPECT_TRUE(accepts(schema_grammar(R"({"type": "array", "items": false})"), "[]"));
  EXPECT_FALSE(accepts(schema_grammar(R"({"type": "array", "items": false})"), "[1]"));
  // Draft 7's tuple form.
  const Grammar draft7 = schema_grammar(
      R"({"type": "array", "items": [{"type": "boolean"}, {"type": "integer"}], "additionalItems": false, "minItems": 2})");
  EXPECT_TRUE(accepts(draft7, "[true, 3]"));
  EXPECT_FALSE(accepts(draft7, "[true]"));
  EXPECT_FALSE(accepts(draft7, "[true, 3, 4]"));
}

TEST(JsonSchemaGrammar, PatternsOfTheSubsetRealSchemasUse) {
  auto pattern = [](const std::string& p) {
    return json_schema_grammar(ojson{{"type", "string"}, {"pattern", p}});
  };
  struct Case {
    const char* pattern;
    std::vector<std::string> ok, bad;  // JSON string texts
  };
  const Case cases[] = {
      {"^[A-Z]{3}-[0-9]{2}$", {R"("ABC-12")"}, {R"("ABC-123")", R"("abc-12")", R"("AB-12")", R"(" ABC-12")"}},
      {"[0-9]", {R"("x5y")", R"("5")", R"("\n7")"}, {R"("xy")", R"("")"}},
      {R"(^\d{4}-\d{2}-\d{2}$)", {R"("2026-12-07")"}, {R"("2026-1-07")", R"("2026-12-07T")"}},
      {"^[a-zA-Z_][a-zA-Z0-9_]*$", {R"("_x1")", R"("abc")"}, {R"("1abc")", R"("")", R"("a-b")"}},
      {R"(^\+?[0-9 ()-]{7,15}$)",
       {R"("+1 (555) 123-456")", R"("5551234")"},
       {R"("555123")", R"("+1 555 abc")"}},
      {"^(cat|dog)s?$", {R"("cat")", R"("dogs")"}, {R"("cats!")", R"("cow")", R"("catdog")"}},
      {"^a|b$", {R"("ax")", R"("xb")"}, {R"("xa")", R"("bx")"}},
      {R"(^"\\$)", {R"("\"\\")"}, {R"("\"")", R"("\\\\")"}},
      {"^[à-ÿ]+$", {R"("é")", R"("ÿà")"}, {R"("e")", R"("Ā")"}},
      {"^[^,]+$", {R"("héllo wörld")", R"("\t")"}, {R"("a,b")", R"("")"}},
      {R"(^\t\u00e9.$)", {R"("\té!")", R"("\té日")"}, {R"("\té\n")", R"("\té")", R"("\tÉx")"}},
      {R"(^\s*$)", {R"("")", R"(" \t\n")", "\"\u3000\""}, {R"("a")"}},
      {"^(?:ab){2,3}c?$", {R"("abab")", R"("abababc")"}, {R"("ab")", R"("abababab")"}},
      {"^x{2}(?<name>y)+?$", {R"("xxy")", R"("xxyyy")"}, {R"("xy")"}},
      {"^[\\w.-]+@[\\w-]+\\.[a-z]{2,}$", {R"("a.b-c@mail.com")"}, {R"("a@b.c")", R"("@b.com")"}},
  };
  for (const Case& c : cases) {
    const Grammar g = pattern(c.pattern);
    for (const std::string& t : c.ok) EXPECT_TRUE(accepts(g, t)) << c.pattern << " should accept " << t;
    for (const std::string& t : c.bad) EXPECT_FALSE(accepts(g, t)) << c.pattern << " should refuse " << t;
  }
  // Every construct outside the subset is named.
  for (const auto& [p, named] : std::vector<std::pair<std::string, std::string>>{
           {"(?=a)", "lookaround"},
           {"(?<!a)b", "lookaround"},
           {R"((a)\1)", "backreference"},
           {R"(\bword)", "word boundary"},
           {"a**", "quantifier after a quantifier"},
           {"(a*)*", "can be empty"},
           {R"(\p{L})", "Unicode property"},
           {"a^b", "anchor"},
           {"(^a)", "anchor"},
           {"[z-a]", "out of order"},
           {"a{3,1}", "n < m"},
           {"a{1000}", "above 256"},
           {"(ab", "unterminated group"},
           {"ab)", "unbalanced"},
           {"[ab", "unterminated"},
           {"*a", "nothing to repeat"},
           {std::string(33, '(') + "a" + std::string(33, ')'), "nested deeper than 32"},
       }) {
    try {
      pattern(p);
      ADD_FAILURE() << p << " was accepted";
    } catch (const SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << p << ": " << e.what();
    }
  }
  EXPECT_THROW(schema_grammar(R"({"type": "string", "pattern": "^a$", "maxLength": 3})"), SchemaError);
}

TEST(JsonSchemaGrammar, FormatsOfAddresses) {
  auto format = [](const char* f) {
    return schema_grammar(std::string(R"({"type": "string", "format": ")") + f + "\"}");
  };
  auto quoted = [](const std::string& v) { return "\"" + v + "\""; };
  const Grammar ipv4 = format("ipv4");
  for (const char* ok : {"0.0.0.0", "192.168.1.255", "255.255.255.255", "10.0.0.1"})
    EXPECT_TRUE(accepts(ipv4, quoted(ok))) << ok;
  for (const char* bad : {"256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1..2.3"})
    EXPECT_FALSE(accepts(ipv4, quoted(bad))) << bad;
  const Grammar ipv6 = format("ipv6");
  for (const char* ok :
       {"::", "::1", "1::", "fe80::1:2", "2001:db8:0:0:0:0:2:1", "1:2:3:4:5:6:7::", "ABCD:ef01::"})
    EXPECT_TRUE(accepts(ipv6, quoted(ok))) << ok;
  for (const char* bad : {":::", "1:2:3:4:5:6:7:8:9", "12345::", "1::2::3", "1:2:3:4:5:6:7:8::", "g::"})
    EXPECT_FALSE(accepts(ipv6, quoted(bad))) << bad;
  const Grammar host = format("hostname");
  for (const char* ok : {"localhost", "api.example.com", "a-b.c0", "x1.y2.z3.w4.v5"})
    EXPECT_TRUE(accepts(host, quoted(ok))) << ok;
  for (const char* bad : {"-a.com", "a-.com", "a..b", ".a", "a.", "a_b", "a.b.c.d.e.f"})
    EXPECT_FALSE(accepts(host, quoted(bad))) << bad;
  EXPECT_FALSE(accepts(host, quoted(std::string(49, 'a')))) << "labels of up to 48 characters";
  const Grammar email = format("email");
  for (const char* ok : {"ann@example.com", "first.last+tag@mail.example.org", "o'neil@x.io", "a@b"})
    EXPECT_TRUE(accepts(email, quoted(ok))) << ok;
  for (const char* bad : {"@example.com", "ann@", "a..b@x.com", ".a@x.com", "a b@x.com", "ann"})
    EXPECT_FALSE(accepts(email, quoted(bad))) << bad;
  const Grammar uri = format("uri");
  for (const char* ok : {"https://example.com", "http://10.0.0.1:8080/a/b?q=1&r=%20#frag",
                         "s3://bucket/key.txt", "ftp://h/", "https://api.example.com/v1/items?id=42"})
    EXPECT_TRUE(accepts(uri, quoted(ok))) << ok;
  for (const char* bad : {"example.com", "http://", "1http://x", "http://x/%zz", "http://x/a b"})
    EXPECT_FALSE(accepts(uri, quoted(bad))) << bad;
}

TEST(JsonSchemaGrammar, FormatsDateTimeDateTimeAndUuid) {
  const Grammar date = schema_grammar(R"({"type": "string", "format": "date"})");
  for (const char* ok :
       {"\"2024-02-29\"", "\"2000-02-29\"", "\"1999-12-31\"", "\"2021-04-30\"", "\"0000-02-29\""})
    EXPECT_TRUE(accepts(date, ok)) << ok;
  for (const char* bad : {"\"2023-02-29\"", "\"1900-02-29\"", "\"2021-04-31\"", "\"2021-13-01\"",
                          "\"2021-00-10\"", "\"2021-01-00\"", "\"21-01-01\""})
    EXPECT_FALSE(accepts(date, bad)) << bad;
  const Grammar time = schema_grammar(R"({"type": "string", "format": "time"})");
  EXPECT_TRUE(accepts(time, "\"23:59:59Z\""));
  EXPECT_TRUE(accepts(time, "\"00:00:00.123456789+05:30\""));
  EXPECT_FALSE(accepts(time, "\"24:00:00Z\""));
  EXPECT_FALSE(accepts(time, "\"12:60:00Z\""));
  EXPECT_FALSE(accepts(time, "\"12:00:00\"")) << "an offset is required";
  const Grammar dt = schema_grammar(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(accepts(dt, "\"2024-01-31T10:20:30Z\""));
  EXPECT_FALSE(accepts(dt, "\"2024-01-31 10:20:30Z\""));
  const Grammar uuid = schema_grammar(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(accepts(uuid, "\"123e4567-e89b-12d3-a456-426614174000\""));
  EXPECT_FALSE(accepts(uuid, "\"123e4567e89b12d3a456426614174000\""));
  EXPECT_THROW(schema_grammar(R"({"type": "string", "format": "date", "maxLength": 3})"), SchemaError);
}

TEST(JsonSchemaGrammar, RefsIncludingRecursionAndAnnotations) {
  const Grammar g = schema_grammar(R"({
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Tree", "description": "a tree",
    "$ref": "#/$defs/node",
    "$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer", "default": 0, "examples": [1]},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}})");
  EXPECT_TRUE(accepts(g, R"({"v":1})"));
  EXPECT_TRUE(accepts(g, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"));
  EXPECT_FALSE(accepts(g, R"({"v":1,"kids":[{}]})"));
}

TEST(JsonSchemaGrammar, AnyJsonObject) {
  const Grammar g = json_object_grammar();
  EXPECT_TRUE(accepts(g, R"({})"));
  EXPECT_TRUE(accepts(g, R"({"a": [1, {"b": null}, "x", -0.5E-7], "c": {"d": true}})"));
  EXPECT_FALSE(accepts(g, R"([1])"));
  EXPECT_FALSE(accepts(g, R"({"a": })"));
  EXPECT_FALSE(accepts(g, R"({'a': 1})"));
}

TEST(JsonSchemaGrammar, UnsupportedOrInvalidSchemasNameTheProblem) {
  auto error_of = [](const std::string& schema) -> std::string {
    try {
      schema_grammar(schema);
    } catch (const SchemaError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_NE(error_of(R"({"type": "string", "pattern": "(?=a)b"})").find("lookaround"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "integer", "pattern": "^a$"})").find("unsupported keyword 'pattern' at #"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "object", "properties": {"d": {"type": "string", "format": "idn-email"}}})")
                .find("'format' 'idn-email' at #/properties/d is not supported"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "strin"})").find("unknown type 'strin'"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref": "#/$defs/missing"})").find("missing"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "object", "required": ["x"], "properties": {}})").find("'x'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "number", "minimum": 0, "multipleOf": 2})").find("'multipleOf' on a number"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "number", "minimum": 5, "exclusiveMaximum": 5})").find("no number"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "integer", "multipleOf": 1009})").find("steps up to 500"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "integer", "multipleOf": -2})").find("greater than 0"), std::string::npos);
  EXPECT_NE(
      error_of(R"({"type": "integer", "minimum": 1, "maximum": 4, "multipleOf": 5})").find("no integer"),
      std::string::npos);
  EXPECT_NE(error_of(R"({"type": "array", "maxItems": 100000})").find("maxItems"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "integer", "minimum": 5, "maximum": 1})").find("no integer"),
            std::string::npos);
  EXPECT_NE(error_of(R"(5)").find("must be an object or a boolean"), std::string::npos);
  EXPECT_NE(error_of(R"({"not": {}})").find("unsupported keyword 'not'"), std::string::npos);
}

// A random walk through the grammar's bytes, closers favoured (a model at temperature 1 with
// no preference would wander as long; the walk is capped). Empty when it did not finish.
std::string random_document(const Grammar& g, std::mt19937_64& rng) {
  Matcher m(g);
  std::string out;
  while (out.size() < 3000) {
    std::vector<uint8_t> allowed;
    std::vector<double> weight;
    for (int b = 0; b < 256; ++b)
      if (!m.advance(m.state(), static_cast<uint8_t>(b)).empty()) {
        allowed.push_back(static_cast<uint8_t>(b));
        weight.push_back(std::string("\"}],").find(static_cast<char>(b)) != std::string::npos ? 30.0 : 1.0);
      }
    if (m.accepting() && (allowed.empty() || rng() % 3 == 0)) return out;
    if (allowed.empty()) return "";
    std::discrete_distribution<size_t> pick(weight.begin(), weight.end());
    const uint8_t b = allowed[pick(rng)];
    m.feed_byte(b);
    out.push_back(static_cast<char>(b));
  }
  return "";
}

// Random walks through a schema's grammar (each step a random allowed byte, closing bytes
// favoured so that walks end) always give JSON that parses.
TEST(JsonSchemaGrammar, RandomWalksGiveParsableJson) {
  const Grammar g = schema_grammar(R"({"type": "object", "properties": {
      "a": {"type": "integer", "minimum": 3, "maximum": 7}, "b": {"type": "array", "items": {"type": "boolean"}},
      "c": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]}, "d": {}}, "required": ["a", "c"]})");
  std::mt19937_64 rng(7);
  int finished = 0;
  for (int walk = 0; walk < 200; ++walk) {
    const std::string out = random_document(g, rng);
    if (out.empty()) continue;
    ++finished;
    const auto doc = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << out;
    ASSERT_TRUE(doc.is_object()) << out;
    EXPECT_GE(doc["a"].get<int>(), 3);
    EXPECT_LE(doc["a"].get<int>(), 7);
    EXPECT_TRUE(doc.contains("c"));
  }
  EXPECT_GT(finished, 150);
}

}  // namespace
}  // namespace swarm::grammar

// ------------------------------------------------------------------------------ token masks
namespace swarm::grammar {
namespace {

// Every token allowed by the masker is one whose bytes the matcher accepts in turn, and the
// other way round — checked at every step of random walks, against a brute-force scan.
TEST(TokenMasker, AgreesWithFeedingEveryTokenByItself) {
  std::vector<std::string> vocab = {
      "{",    "}",     "\"",    ":",  ",",  " ",    "\n",   "  ",       "a",  "b",       "ab",   "ba", "\"a",
      "\":",  "\":\"", "\",\"", "0",  "1",  "12",   "-",    "-1",       ".",  "e",       "true", "tr", "ue",
      "null", "[",     "]",     "[]", "{}", "\xc3", "\xa9", "\xc3\xa9", "é!", "<|end|>", "<tc>", ""};
  for (int ch = 0x20; ch < 0x7f; ++ch)
    vocab.push_back(std::string(1, static_cast<char>(ch)));  // no dead ends
  std::vector<bool> special(vocab.size(), false);
  const uint32_t kEnd = 35, kTc = 36;
  special[kEnd] = special[kTc] = true;
  auto trie = std::make_shared<TokenTrie>(vocab, special);
  // <tc> {"k": <an object of the schema>} <tc>
  Grammar g;
  JsonSchemaCompiler c(
      g,
      ojson::parse(R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}},
      "b": {"type": "string"}, "c": {"type": "boolean"}}, "required": ["b"]})"));
  const uint32_t value = c.value(
      ojson::parse(R"({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}},
      "b": {"type": "string"}, "c": {"type": "boolean"}}, "required": ["b"]})"),
      "#");
  g.set_root(g.rule_of({{Element::token(kTc), Element::rule(value), Element::token(kTc)}}));
  Matcher m(g);
  TokenMasker masker(trie, {kEnd});
  std::mt19937_64 rng(3);
  int finished = 0;
  for (int walk = 0; walk < 100; ++walk) {
    Matcher::State s = m.state();
    for (int step = 0; step < 200; ++step) {
      const TokenMask& mask = masker.allowed(m, s);
      std::vector<uint32_t> allowed;
      for (uint32_t id = 0; id < vocab.size(); ++id) {
        bool ok;
        if (id == kEnd)
          ok = !s.empty() && s.front() == 0;
        else if (special[id])
          ok = !m.advance_token(s, id).empty();
        else if (vocab[id].empty())
          ok = false;
        else {
          Matcher::State t = s;
          for (unsigned char ch : vocab[id])
            if ((t = m.advance(t, ch)).empty()) break;
          ok = !t.empty();
        }
        ASSERT_EQ(mask_allows(mask, id), ok) << "token " << id << " '" << vocab[id] << "' at step " << step;
        if (ok) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty());
      const uint32_t pick = allowed[rng() % allowed.size()];
      if (pick == kEnd) {
        ++finished;
        break;
      }
      if (special[pick])
        s = m.advance_token(s, pick);
      else
        for (unsigned char ch : vocab[pick]) s = m.advance(s, ch);
    }
  }
  EXPECT_GT(finished, 0);
  EXPECT_GT(masker.cache_hits(), 0u);
}

// The cached path (cut stacks' masks shared between contexts, plus the walks below the cut)
// gives exactly the mask of a scan of the whole trie, at every step of random walks over 300
// random schemas and a counted-string schema, with caches small enough to evict all the time.
// The vocabulary has many multi-byte tokens that cross JSON boundaries (`ab",`, `"}`, `1,"`).
TEST(TokenMasker, CachedMasksEqualTheFullScan) {
  std::mt19937_64 rng(21);
  std::vector<std::string> vocab;
  for (int ch = 0x20; ch < 0x7f; ++ch) vocab.push_back(std::string(1, static_cast<char>(ch)));
  vocab.push_back("\\n");
  vocab.push_back("\\u00e9");
  vocab.push_back("\\u00");
  vocab.push_back("\xc3\xa9");
  vocab.push_back("\xc3");
  vocab.push_back("\xa9");
  const std::string alphabet = "\"\"\"\",,::{}[] \n\tabcxyz019-.eE+\\tfrulen";
  for (int i = 0; i < 3000; ++i) {
    std::string t;
    const int len = 2 + static_cast<int>(rng() % 7);
    for (int k = 0; k < len; ++k) t += alphabet[rng() % alphabet.size()];
    vocab.push_back(t);
  }
  const uint32_t kEnd = static_cast<uint32_t>(vocab.size());
  vocab.push_back("<|end|>");
  std::vector<bool> special(vocab.size(), false);
  special[kEnd] = true;
  auto trie = std::make_shared<TokenTrie>(vocab, special);
  std::vector<ojson> schemas{
      ojson::parse(R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 6},
      "b": {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 5}}}, "required": ["a", "b"]})")};
  for (int i = 0; i < 300; ++i) schemas.push_back(swarm::testing::random_schema(rng, 3, false));
  size_t steps = 0, local_hits = 0;
  for (const ojson& schema : schemas) {
    const Grammar g = json_schema_grammar(schema);
    Matcher m(g);
    TokenMasker masker(trie, {kEnd}, /*cache_entries=*/4, /*local_entries=*/8);
    Matcher::StateId s = m.state_id(m.state());
    for (int step = 0; step < 60; ++step, ++steps) {
      const TokenMask mask = masker.allowed(m, s);
      ASSERT_EQ(mask, masker.scan(m, s)) << schema.dump() << " at step " << step;
      std::vector<uint32_t> allowed;
      for (uint32_t id = 0; id < vocab.size(); ++id)
        if (mask_allows(mask, id)) allowed.push_back(id);
      ASSERT_FALSE(allowed.empty()) << schema.dump();
      const uint32_t pick = allowed[rng() % allowed.size()];
      if (pick == kEnd) break;
      for (unsigned char ch : vocab[pick]) s = m.step_id(s, ch);
      ASSERT_NE(s, 0u);
    }
    local_hits += masker.local_hits();
  }
  EXPECT_GT(steps, 3000u);
  EXPECT_GT(local_hits, 0u);  // cut stacks are shared between states
}

}  // namespace
}  // namespace swarm::grammar

// ------------------------------------------------------------------------------ cache bounds
namespace swarm::grammar {
namespace {

// A vocabulary of printable ASCII and a few multi-byte JSON pieces, and an end token.
std::shared_ptr<TokenTrie> small_vocabulary(std::vector<std::string>& vocab, uint32_t& end) {
  for (int ch = 0x20; ch < 0x7f; ++ch) vocab.push_back(std::string(1, static_cast<char>(ch)));
  for (const char* t : {"{\"", "\":", "\",\"", "true", "false", "12", "\"}"}) vocab.push_back(t);
  end = static_cast<uint32_t>(vocab.size());
  vocab.push_back("<|end|>");
  std::vector<bool> special(vocab.size(), false);
  special[end] = true;
  return std::make_shared<TokenTrie>(vocab, special);
}

// Filling the compiled-grammar cache with schemas: once the byte bound is reached the least
// recently used grammars go, the cache stays within both bounds at every step, a grammar in
// use keeps its place, and a grammar handed out before its eviction still matches.
TEST(GrammarCache, ByteBoundEvictsLeastRecentlyUsed) {
  const auto schema = [](int i) {
    return ojson::parse(R"({"type": "object", "properties": {"p)" + std::to_string(i) +
                        R"(": {"type": "string", "maxLength": 12}, "n": {"type": "integer", "minimum": 0}},
                        "required": ["p)" +
                        std::to_string(i) + R"("]})");
  };
  const size_t one = json_schema_grammar(schema(0)).memory_bytes();
  ASSERT_GT(one, 1000u);  // the tables are counted, not just the object
  const size_t bound = 8 * one;
  GrammarCache cache(/*max_entries=*/1000, bound);
  int builds = 0;
  const auto get = [&](int i) {
    return cache.get("schema:" + schema(i).dump(), [&] {
      ++builds;
      return json_schema_grammar(schema(i));
    });
  };
  const std::shared_ptr<const Grammar> first = get(0);
  const std::shared_ptr<const Grammar> hot = get(1);
  for (int i = 2; i < 100; ++i) {
    get(i);
    EXPECT_EQ(get(1), hot);  // used at every step: never the least recently used
    EXPECT_LE(cache.bytes(), bound) << "after " << i + 1 << " schemas";
    EXPECT_LE(cache.size(), 9u);
  }
  EXPECT_EQ(builds, 100);
  EXPECT_GE(cache.size(), 4u);  // the estimate is one grammar's size, not wildly more
  EXPECT_GE(cache.evictions(), 90u);
  EXPECT_GT(cache.bytes(), bound / 2);
  // The first was evicted: asking again compiles it again; the copy held before still works.
  EXPECT_NE(get(0), first);
  EXPECT_EQ(builds, 101);
  EXPECT_TRUE(accepts(*first, R"({"p0": "abc", "n": 7})"));
  // The source text is charged as well: a long key costs more than a short one.
  GrammarCache texts(/*max_entries=*/10, /*max_bytes=*/kDefaultGrammarCacheBytes);
  texts.get("a", [] { return json_object_grammar(); });
  const size_t short_key = texts.bytes();
  texts.get(std::string(10000, 'b'), [] { return json_object_grammar(); });
  EXPECT_GE(texts.bytes(), 2 * short_key + 10000);
}

// Masks by state under a byte bound: walking many states keeps the cache within the bytes (with
// room for far more entries), evicts, and still gives exactly the full scan's masks.
TEST(TokenMasker, ByteBoundEvictsMasks) {
  std::vector<std::string> vocab;
  uint32_t end = 0;
  auto trie = small_vocabulary(vocab, end);
  const Grammar g = json_schema_grammar(ojson::parse(
      R"({"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string", "maxLength": 30}}}})"));
  Matcher m(g);
  const size_t per_mask =
      sizeof(TokenMask) + (vocab.size() + 63) / 64 * 8 + LruCache<uint32_t, TokenMask>::kEntryOverhead;
  const size_t bytes = 30 * per_mask;  // two thirds of it for masks by state: 20 masks
  TokenMasker masker(trie, {end}, /*cache_entries=*/100000, /*local_entries=*/100000, bytes);
  const size_t matcher_bytes = m.memory_bytes();
  std::mt19937_64 rng(47);
  size_t states = 0;
  for (int walk = 0; walk < 50; ++walk) {
    Matcher::StateId s = m.state_id(m.state());
    for (int step = 0; step < 80; ++step, ++states) {
      const std::shared_ptr<const TokenMask> mask = masker.allowed_shared(m, s);
      ASSERT_EQ(*mask, masker.scan(m, s)) << "step " << step;
      ASSERT_LE(masker.cached_bytes(), bytes);
      ASSERT_LE(masker.cached_masks(), 20u);
      std::vector<uint32_t> allowed;
      for (uint32_t id = 0; id < end; ++id)
        if (mask_allows(*mask, id)) allowed.push_back(id);
      if (allowed.empty()) break;
      for (unsigned char ch : vocab[allowed[rng() % allowed.size()]]) s = m.step_id(s, ch);
    }
  }
  EXPECT_GT(states, 500u);
  EXPECT_GT(m.arena_size(), 40u);  // more distinct states than the bound holds
  EXPECT_GT(masker.cache_evictions(), 0u);
  EXPECT_GE(masker.cached_masks(), 10u);
  EXPECT_GT(masker.memory_bytes(), masker.cached_bytes());
  EXPECT_GT(m.memory_bytes(), matcher_bytes + 40 * 1024);  // a 1 KiB transition block per state stepped
}

// What a batch does in one step: take the first row's mask, then compute the other rows'
// masks, which evicts the first from the cache. The mask taken stays the first state's mask,
// owned by its holder alone, however much the cache evicted and allocated meanwhile.
TEST(TokenMasker, AMaskHeldForAStepOutlivesItsEviction) {
  std::vector<std::string> vocab;
  uint32_t end = 0;
  auto trie = small_vocabulary(vocab, end);
  const Grammar g = json_schema_grammar(ojson::parse(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a", "b"]})"));
  Matcher m(g);
  std::vector<Matcher::StateId> rows{m.state_id(m.state())};
  for (unsigned char ch : std::string(R"({"a": 12, "b": true})")) rows.push_back(m.step_id(rows.back(), ch));
  ASSERT_NE(rows.back(), 0u);
  TokenMasker masker(trie, {end}, /*cache_entries=*/1, /*local_entries=*/1);
  const TokenMask expected = masker.scan(m, rows[0]);
  const std::shared_ptr<const TokenMask> held = masker.allowed_shared(m, rows[0]);
  ASSERT_EQ(*held, expected);
  size_t different = 0;
  for (size_t r = 1; r < rows.size(); ++r) {
    const std::shared_ptr<const TokenMask> other = masker.allowed_shared(m, rows[r]);
    different += *other != expected;
  }
  ASSERT_GT(different, 10u);
  EXPECT_EQ(masker.cached_masks(), 1u);
  EXPECT_GE(masker.cache_evictions(), rows.size() - 1);
  EXPECT_EQ(held.use_count(), 1) << "the cache still owns (or nobody owns) an evicted mask";
  EXPECT_EQ(*held, expected) << "the mask held for the step changed after its eviction";
  // The reference form stays valid until the next allowed() even when the cache drops its entry.
  const TokenMask& last = masker.allowed(m, rows[0]);
  const std::shared_ptr<const TokenMask> next_row = masker.allowed_shared(m, rows[5]);
  EXPECT_NE(*next_row, expected);
  EXPECT_EQ(last, expected);
}

}  // namespace
}  // namespace swarm::grammar

// ------------------------------------------------------------------------------ property test
namespace swarm::grammar {
namespace {

// 1,200 seeded random schemas, a document generated under each one's grammar, all validated by
// python3-jsonschema (tests/reference/validate_json_documents.py), which shares no code with us.
TEST(JsonSchemaGrammar, GeneratedDocumentsValidateIndependently) {
  std::mt19937_64 rng(20261125);
  const std::string path = ::testing::TempDir() + "swarm_grammar_documents.jsonl";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  int written = 0, unfinished = 0;
  // Every keyword the grammar supports appears in at least 5 of the documents checked.
  std::map<std::string, int> covered;
  for (const char* k :
       {"\"minimum\"", "\"exclusiveMinimum\"", "\"exclusiveMaximum\"", "\"multipleOf\"", "\"pattern\"",
        "\"prefixItems\"", "\"items\":false", "\"format\":\"email\"", "\"format\":\"hostname\"",
        "\"format\":\"ipv4\"", "\"format\":\"ipv6\"", "\"format\":\"uri\"", "\"format\":\"date-time\"",
        "\"$ref\"", "\"anyOf\"", "\"maxLength\"", "\"enum\""})
    covered[k] = 0;
  for (int i = 0; i < 1200; ++i) {
    const bool with_defs = i % 4 == 0;
    ojson schema = swarm::testing::random_schema(rng, 3, with_defs);
    if (with_defs) schema["$defs"] = {{"item", swarm::testing::random_schema(rng, 1, false)}};
    const Grammar g = json_schema_grammar(schema);
    const std::string doc = random_document(g, rng);
    if (doc.empty()) {
      ++unfinished;
      continue;
    }
    const std::string line = nlohmann::json{{"schema", schema}, {"document", doc}}.dump() + "\n";
    std::fwrite(line.data(), 1, line.size(), f);
    ++written;
    for (auto& [keyword, n] : covered)
      if (line.find(keyword) != std::string::npos) ++n;
  }
  std::fclose(f);
  EXPECT_GE(written, 1000) << unfinished << " walks did not finish";
  for (const auto& [keyword, n] : covered) EXPECT_GE(n, 5) << keyword << " is rarely exercised: " << n;
  const auto [rc, output] = swarm::testing::validate_json_documents(path);
  if (rc == 77) GTEST_SKIP() << output;
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("ok: " + std::to_string(written) + " documents"), std::string::npos) << output;
}

}  // namespace
}  // namespace swarm::grammar
