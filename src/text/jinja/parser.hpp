// Jinja parser: tokens → AST. Follows Jinja's grammar and operator precedence
// (including its quirks: `-2 ** 2` is 4, `**` is left-associative, tests bind tighter than `not`).
#pragma once

#include <vector>

#include "text/jinja/ast.hpp"
#include "text/jinja/lexer.hpp"

namespace swarm::jinja {

/// Parses a token stream into the template body. Throws jinja::Error with the offset of the
/// offending token. Unknown filters/tests are errors here, except inside `if` branches and
/// conditional expressions, where (as in Jinja) they fail only when evaluated.
Body parse(const std::vector<Token>& tokens);

}  // namespace swarm::jinja
