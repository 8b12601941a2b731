#include "api/structured_output.hpp"

#include "common/error.hpp"
#include "engine/backend.hpp"
#include "grammar/grammar_cache.hpp"
#include "grammar/json_schema_grammar.hpp"

namespace swarm {
namespace {

using ojson = nlohmann::ordered_json;
using grammar::Element;
using grammar::Grammar;

// Compiled grammars by source text, within 64 entries and kDefaultGrammarCacheBytes.
grammar::GrammarCache& cache() {
  static grammar::GrammarCache c;
  return c;
}

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

}  // namespace

std::shared_ptr<const Grammar> response_format_grammar(const ojson& response_format) {
  const ojson& rf = response_format;
  if (rf.is_null()) return nullptr;
  SWARM_REQUIRE(rf.is_object() && rf.contains("type") && rf["type"].is_string(), ErrorKind::INVALID_ARGUMENT,
                "field 'response_format' must be an object with a string 'type'");
  const std::string type = rf["type"].get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") return cache().get("json_object", [] { return grammar::json_object_grammar(); });
  SWARM_REQUIRE(type == "json_schema", ErrorKind::INVALID_ARGUMENT,
                "field 'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  SWARM_REQUIRE(rf.contains("json_schema") && rf["json_schema"].is_object(), ErrorKind::INVALID_ARGUMENT,
                "field 'response_format.json_schema' must be an object");
  const ojson& js = rf["json_schema"];
  if (js.contains("name"))
    SWARM_REQUIRE(js["name"].is_string(), ErrorKind::INVALID_ARGUMENT,
                  "field 'response_format.json_schema.name' must be a string");
  if (js.contains("strict"))
    SWARM_REQUIRE(js["strict"].is_boolean() || js["strict"].is_null(), ErrorKind::INVALID_ARGUMENT,
                  "field 'response_format.json_schema.strict' must be a boolean");
  SWARM_REQUIRE(js.contains("schema") && (js["schema"].is_object() || js["schema"].is_boolean()),
                ErrorKind::INVALID_ARGUMENT,
                "field 'response_format.json_schema.schema' must be a JSON schema (an object)");
  const ojson& schema = js["schema"];
  try {
    return cache().get("schema:" + dump(schema), [&] { return grammar::json_schema_grammar(schema); });
  } catch (const grammar::SchemaError& e) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     std::string("field 'response_format.json_schema.schema': ") + e.what());
  }
}

std::shared_ptr<const Grammar> tool_choice_grammar(const ojson& tools, const std::string& only,
                                                   ToolCallFormat format, bool parallel_tool_calls,
                                                   const Backend& backend) {
  SWARM_REQUIRE(
      format != ToolCallFormat::NONE, ErrorKind::INVALID_ARGUMENT,
      "field 'tool_choice': forcing a tool call needs a tool-call format (the job's tool_call_parser is "
      "none, or the chat template has none)");
  // Hermes wraps calls in <tool_call> ... </tool_call>: as the tokenizer's own tokens when it has them.
  std::vector<Element> open, close;
  const bool hermes = format == ToolCallFormat::HERMES;
  if (hermes) {
    for (auto [tag, out] : {std::pair{"<tool_call>", &open}, std::pair{"</tool_call>", &close}}) {
      const auto ids = backend.encode_rendered(tag);
      if (ids.size() == 1)
        out->push_back(Element::token(static_cast<uint32_t>(ids[0])));
      else
        *out = Grammar::literal(tag);
    }
  }
  std::string key = std::string(hermes ? "hermes" : "llama3") +
                    (parallel_tool_calls ? ":parallel:" : ":one:") + only + ":" +
                    std::to_string(open.size() == 1 ? open[0].ref : 0) + ":" +
                    std::to_string(close.size() == 1 ? close[0].ref : 0) + ":" + dump(tools);
  return cache().get(key, [&] {
    Grammar g;
    std::vector<std::vector<Element>> calls;
    for (size_t i = 0; i < tools.size(); ++i) {
      const ojson& fn = tools[i]["function"];
      const std::string name = fn["name"].get<std::string>();
      if (!only.empty() && name != only) continue;
      const ojson params = fn.contains("parameters") && !fn["parameters"].is_null()
                               ? fn["parameters"]
                               : ojson{{"type", "object"}};
      uint32_t args;
      try {
        grammar::JsonSchemaCompiler c(g, params);
        args = c.value(params, "#");
      } catch (const grammar::SchemaError& e) {
        throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                         "field 'tools[" + std::to_string(i) + "].function.parameters': " + e.what());
      }
      const std::string head =
          "{\"name\": " + ojson(name).dump() + (hermes ? ", \"arguments\": " : ", \"parameters\": ");
      std::vector<Element> call = open;
      if (hermes) call.push_back(Element::byte('\n'));
      for (const Element& e : Grammar::literal(head)) call.push_back(e);
      call.push_back(Element::rule(args));
      call.push_back(Element::byte('}'));
      if (hermes) call.push_back(Element::byte('\n'));
      call.insert(call.end(), close.begin(), close.end());
      calls.push_back(std::move(call));
    }
    const uint32_t one = g.rule_of(calls, "call");
    uint32_t root = one;
    if (parallel_tool_calls && hermes) {  // one or more calls, a newline apart
      root = g.add_rule("calls");
      g.add_alternative(root, {Element::rule(one)});
      g.add_alternative(root, {Element::rule(one), Element::byte('\n'), Element::rule(root)});
    }
    g.set_root(g.rule_of({{Element::rule(root)}}, "root"));
    g.validate();
    return g;
  });
}

}  // namespace swarm
