#include "common/json_nesting.hpp"

#include <string>

#include "common/error.hpp"

namespace swarm {

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > deepest) {
          deepest = depth;
          if (deepest > limit) return limit + 1;
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  return deepest;
}

void require_json_nesting(std::string_view text, std::string_view what, int limit) {
  if (json_nesting_depth(text, limit) > limit) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     std::string(what) + " is nested deeper than " + std::to_string(limit) + " levels");
  }
}

}  // namespace swarm
