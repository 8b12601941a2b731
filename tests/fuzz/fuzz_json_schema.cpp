// libFuzzer target: JSON Schema -> grammar (src/grammar/json_schema_grammar.cpp, with the
// bounded numbers and patterns it builds on) on a schema from a request. An input that starts
// with '{' is a schema; any other input is the `pattern` of a string schema. Whatever it is,
// compiling must end in a grammar or a SchemaError (never a crash, a hang or unbounded
// memory), and a grammar must take the input's bytes without crashing.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/json_nesting.hpp"
#include "grammar/json_schema_grammar.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  nlohmann::ordered_json schema;
  if (!text.empty() && text.front() == '{') {
    if (!swarm::json_nesting_within(text)) return 0;  // refused before parsing, as the server does
    schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded()) return 0;
  } else {
    const std::string pattern(text);
    nlohmann::json check = pattern;  // the server only sees valid UTF-8 strings
    try {
      (void)check.dump();
    } catch (const nlohmann::json::exception&) {
      return 0;
    }
    schema = {{"type", "string"}, {"pattern", pattern}};
  }
  try {
    const swarm::grammar::Grammar g = swarm::grammar::json_schema_grammar(schema);
    swarm::grammar::Matcher m(g);
    for (unsigned char c : text)
      if (!m.feed_byte(c)) break;
  } catch (const swarm::grammar::SchemaError&) {}
  return 0;
}
