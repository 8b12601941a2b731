// JSON Schema -> byte grammar: the language of JSON texts that validate against a
// schema, for constrained decoding of `response_format` and tool-call arguments.
//
// Supported: type (a name or a list), object (properties, required, additionalProperties
// false / true / a schema), array (items, minItems, maxItems), string (enum, const,
// minLength, maxLength, format date / time / date-time / uuid), integer (minimum, maximum,
// exclusiveMinimum, exclusiveMaximum), number (no bounds), boolean, null, enum and const of any JSON value,
// anyOf, oneOf (when its branches are provably exclusive — different types, different const /
// enum values, or objects with a required property of different const values — it is the same
// language as anyOf; other oneOfs are refused), allOf with one member, nullable (OpenAPI), $ref
// to "#", "#/$defs/NAME" or "#/definitions/NAME" (recursive references included). Annotations
// ($schema, $id, title, description, default, examples, $comment, deprecated, readOnly,
// writeOnly, and OpenAPI's discriminator, which only names the tag) are ignored. Any other keyword is a SchemaError
// naming it and where it is: never silently unconstrained.
//
// Generation order and whitespace: object properties come in the schema's order (required
// ones always, optional ones may be left out); with additionalProperties other than false,
// only the declared properties are generated unless there are none (then any keys, values per
// additionalProperties). Between JSON tokens at most one space, or one newline followed by up
// to 16 spaces: a model cannot stall in whitespace.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>

#include "grammar/grammar.hpp"

namespace swarm::grammar {

/// A schema that is invalid or uses what is not supported; what() names the keyword and path.
class SchemaError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct JsonGrammarLimits {
  size_t max_schema_bytes = size_t{64} * 1024;  // the serialized schema
  size_t max_rules = 20000;                     // the compiled grammar
  int64_t max_repeat_bound = 256;               // minItems / maxItems / minLength / maxLength expand
};

/// The grammar of one JSON value validating against `schema`. `schema` true / {} means any value.
/// Keys are read in the order given (ordered_json): properties are generated in that order.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonGrammarLimits& limits = {});
/// The grammar of any JSON object (response_format json_object).
Grammar json_object_grammar();

/// Builds schema rules into an existing grammar (e.g. around a tool-call envelope).
class JsonSchemaCompiler {
 public:
  JsonSchemaCompiler(Grammar& g, const nlohmann::ordered_json& root_schema, JsonGrammarLimits limits = {});
  ~JsonSchemaCompiler();
  JsonSchemaCompiler(const JsonSchemaCompiler&) = delete;
  JsonSchemaCompiler& operator=(const JsonSchemaCompiler&) = delete;
  /// The rule of a value validating against `schema` (a part of the root schema; `path` names it
  /// in errors, e.g. "#/properties/a").
  uint32_t value(const nlohmann::ordered_json& schema, const std::string& path);
  /// Whitespace between JSON tokens (bounded).
  uint32_t ws();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace swarm::grammar
