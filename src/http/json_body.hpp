// Reading request JSON with errors that name the offending field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace swarm {

/// Parses a request body that must be a JSON object (INVALID_ARGUMENT otherwise).
/// An empty body is treated as {} when `allow_empty`.
nlohmann::json parse_json_object(const std::string& body, bool allow_empty = false);

/// Serialises JSON for the wire; invalid UTF-8 in strings is replaced, never thrown on.
std::string dump_json(const nlohmann::json& j);

// Field accessors: absent (or null for the optional_*) → default/nullopt; present with the
// wrong type → SwarmError INVALID_ARGUMENT "field 'x' must be ...".
std::string require_string(const nlohmann::json& obj, const char* field, bool allow_empty = false);
std::optional<std::string> optional_string(const nlohmann::json& obj, const char* field);
std::optional<double> optional_number(const nlohmann::json& obj, const char* field);
std::optional<int64_t> optional_int(const nlohmann::json& obj, const char* field);
std::optional<bool> optional_bool(const nlohmann::json& obj, const char* field);
/// Requires an object-typed field if present; returns nullptr json when absent/null.
const nlohmann::json* optional_object(const nlohmann::json& obj, const char* field);

}  // namespace swarm
