#include "http/json_body.hpp"

#include <cmath>

#include "common/error.hpp"
#include "common/json_nesting.hpp"

namespace swarm {
namespace {

[[noreturn]] void wrong(const char* field, const char* expected) {
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, std::string("field '") + field + "' must be " + expected);
}

const nlohmann::json* find(const nlohmann::json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

nlohmann::json parse_json_object(const std::string& body, bool allow_empty) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) {
    if (allow_empty) return nlohmann::json::object();
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "request body is empty; expected a JSON object");
  }
  // Before parsing: a deeper value would overflow the stack where it is dumped or copied.
  require_json_nesting(body, "request body");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(body);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e400
    // Say where and why (e.g. "ill-formed UTF-8 byte"), without the library's "[json.exception...]" tag.
    std::string why = e.what();
    if (auto tag_end = why.find("] "); why.rfind("[json.exception", 0) == 0 && tag_end != std::string::npos)
      why.erase(0, tag_end + 2);
    if (why.size() > 200) why = why.substr(0, 200) + "...";  // "last read" may quote a long token
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "request body is not valid JSON: " + why);
  }
  if (!j.is_object()) throw SwarmError(ErrorKind::INVALID_ARGUMENT, "request body must be a JSON object");
  return j;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string require_string(const nlohmann::json& obj, const char* field, bool allow_empty) {
  const auto* v = find(obj, field);
  if (!v)
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, std::string("missing required field '") + field + "'");
  if (!v->is_string()) wrong(field, "a string");
  std::string s = v->get<std::string>();
  if (!allow_empty && s.empty()) wrong(field, "a non-empty string");
  return s;
}

std::optional<std::string> optional_string(const nlohmann::json& obj, const char* field) {
  const auto* v = find(obj, field);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong(field, "a string");
  return v->get<std::string>();
}

std::optional<double> optional_number(const nlohmann::json& obj, const char* field) {
  const auto* v = find(obj, field);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong(field, "a number");
  double d = v->get<double>();
  if (!std::isfinite(d)) wrong(field, "a finite number");
  return d;
}

std::optional<int64_t> optional_int(const nlohmann::json& obj, const char* field) {
  const auto* v = find(obj, field);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  wrong(field, "an integer");
}

std::optional<bool> optional_bool(const nlohmann::json& obj, const char* field) {
  const auto* v = find(obj, field);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong(field, "a boolean");
  return v->get<bool>();
}

const nlohmann::json* optional_object(const nlohmann::json& obj, const char* field) {
  const auto* v = find(obj, field);
  if (v && !v->is_object()) wrong(field, "an object");
  return v;
}

}  // namespace swarm
