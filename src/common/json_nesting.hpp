// Nesting bounds for untrusted JSON and YAML (docs/reliability.md, "Limits").
//
// nlohmann::json parses iteratively, but dumping, copying and comparing a value recurse once
// per level of nesting, as do our own walkers (the chat template's value conversion, metric
// flattening): a 200 KB body of `[[[[...` overflows the stack there. Every document that comes
// from outside (request bodies, JSON inside request fields, exchange messages, rank messages,
// model and tokenizer files, job YAML) is checked with these before anything recursive touches
// it. The scan is linear, allocation-free and stops at the first level over the bound.
#pragma once

#include <string_view>

namespace swarm {

/// The deepest nesting of arrays/objects accepted in an untrusted JSON or YAML document.
/// `{}` and `[]` are depth 1; `{"a": [1]}` is depth 2.
inline constexpr int kMaxJsonNesting = 128;

/// The nesting depth of the JSON text `text` (brackets inside strings are not counted; the text
/// need not be valid JSON), or `limit + 1` as soon as it goes over `limit`.
int json_nesting_depth(std::string_view text, int limit = kMaxJsonNesting);

/// Whether `text` nests no deeper than `limit`.
inline bool json_nesting_within(std::string_view text, int limit = kMaxJsonNesting) {
  return json_nesting_depth(text, limit) <= limit;
}

/// Throws SwarmError(INVALID_ARGUMENT) "<what> is nested deeper than <limit> levels" when
/// `text` goes over `limit`.
void require_json_nesting(std::string_view text, std::string_view what, int limit = kMaxJsonNesting);

}  // namespace swarm
