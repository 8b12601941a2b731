// JSON Schema `pattern` -> byte grammar: the JSON string bodies (between the quotes) whose value
// contains a match of an ECMAScript regular expression, for the subset real schemas use. No
// torch, no HTTP.
//
// Supported: literals (UTF-8), `.`, character classes with ranges and negation, the escapes
// \d \w \s \D \W \S \t \n \r \f \v \0 \xHH \uHHHH and escaped punctuation, groups `( )`,
// `(?: )` and `(?<name> )` (captures only group), alternation `|`, the quantifiers ? * + {m}
// {m,} {m,n} (greedy or lazy: the language is the same), and the anchors ^ and $ at the start
// and end of the pattern or of one of its top-level alternatives. A pattern is a search, as
// JSON Schema says: an end without its anchor may have any characters there. Anything else
// (backreferences, lookaround, \b, \p{...}, anchors inside groups, an unbounded repeat of what
// can be empty, groups nested deeper than 32) is a PatternError naming the construct and its offset.
//
// The generated text spells each character as itself in UTF-8, except '"' and '\' (escaped)
// and control characters (\b \f \n \r \t or \u00XX): no other escape spellings, so every value
// is reachable in exactly one spelling.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string_view>

#include "grammar/grammar.hpp"

namespace swarm::grammar {

class PatternError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct PatternLimits {
  int64_t max_repeat = 256;  // the largest m or n of {m,n}
};

/// The rule of a JSON string body (without the quotes) whose value matches `pattern`.
/// `any_chars` is a rule of any string body (used for unanchored ends); `check_size` is called
/// as rules are added and throws when the grammar is too large.
uint32_t pattern_rule(Grammar& g, std::string_view pattern, uint32_t any_chars, const PatternLimits& limits,
                      const std::function<void()>& check_size);

}  // namespace swarm::grammar
