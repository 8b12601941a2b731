// Small UTF-8 helpers for streaming text safely.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace swarm {

/// Length of the longest prefix of `s` that does not end inside a UTF-8 sequence
/// (a truncated sequence at the end is held back; invalid bytes elsewhere pass through).
size_t utf8_complete_prefix(std::string_view s);

/// Appends the UTF-8 encoding of code point `cp` (at most U+10FFFF).
void append_utf8(std::string& out, uint32_t cp);

/// Replaces invalid UTF-8 sequences with U+FFFD so the result is always valid UTF-8.
std::string utf8_sanitize(std::string_view s);

}  // namespace swarm
