// UTF-8 and Unicode character helpers with Python `str` semantics (code points, not bytes),
// as the Jinja interpreter needs them for len(), slicing, strip(), upper() and friends.
#pragma once

#include <string>
#include <string_view>

namespace swarm::jinja::unicode {

/// Decodes UTF-8 into code points; invalid or truncated sequences become U+FFFD.
std::u32string decode(std::string_view s);
/// Encodes code points as UTF-8.
std::string encode(std::u32string_view s);
/// Appends one code point as UTF-8.
void append(std::string& out, char32_t c);
/// Number of code points in a UTF-8 string.
size_t length(std::string_view s);

/// Python's str.isspace() for one character.
bool is_space(char32_t c);
/// Line boundaries of Python's str.splitlines().
bool is_line_break(char32_t c);
/// Python's str.isprintable() for one character (approximation of the Unicode categories).
bool is_printable(char32_t c);
bool is_alpha(char32_t c);
bool is_digit(char32_t c);
bool is_alnum(char32_t c);
/// Whether the character has case (upper or lower form differs).
bool is_cased(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);

/// Full upper/lower case mapping of one character appended to `out` (ß → SS, İ → i̇).
void append_upper(std::u32string& out, char32_t c);
void append_lower(std::u32string& out, char32_t c);

std::string upper(std::string_view s);
std::string lower(std::string_view s);
/// Python's str.title().
std::string title(std::string_view s);
/// Python's str.capitalize().
std::string capitalize(std::string_view s);
/// Python's str.swapcase().
std::string swapcase(std::string_view s);

}  // namespace swarm::jinja::unicode
