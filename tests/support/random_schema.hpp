// Seeded random JSON schemas of the kinds real output types use .
#pragma once

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace swarm::testing {

// A random schema of the kinds real output types use, at most `depth` levels deep.
inline nlohmann::ordered_json random_schema(std::mt19937_64& rng, int depth, bool defs_available) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  const int kind = depth <= 0 ? 2 + pick(7) : pick(10);
  switch (kind) {
    case 0:
    case 1: {  // object
      nlohmann::ordered_json props = nlohmann::ordered_json::object();
      nlohmann::ordered_json required = nlohmann::ordered_json::array();
      const int n = 1 + pick(4);
      for (int i = 0; i < n; ++i) {
        const std::string name = std::string(1, static_cast<char>('a' + i)) + (pick(3) == 0 ? " é\"x" : "");
        props[name] = random_schema(rng, depth - 1, defs_available);
        if (pick(2)) required.push_back(name);
      }
      nlohmann::ordered_json o = {{"type", "object"}, {"properties", props}, {"required", required}};
      if (pick(2)) o["additionalProperties"] = false;
      if (pick(3) == 0) o["description"] = "annotations are ignored";
      return o;
    }
    case 2: {  // string
      nlohmann::ordered_json s = {{"type", "string"}};
      if (pick(2)) s["minLength"] = pick(3);
      if (pick(2)) s["maxLength"] = 3 + pick(6);
      if (pick(5) == 0)
        return nlohmann::ordered_json{{"type", "string"}, {"enum", {"red", "green", "blue \u00e9"}}};
      if (pick(3) == 0) {
        const char* formats[] = {"date",     "uuid", "date-time", "time", "email",
                                 "hostname", "ipv4", "ipv6",      "uri"};
        return nlohmann::ordered_json{{"type", "string"}, {"format", formats[pick(9)]}};
      }
      if (pick(5) == 0) {  // patterns of the subset docs/openai_api.md lists (no \s: Python's differs)
        const char* patterns[] = {"^[A-Z]{3}-[0-9]{2}$",
                                  "^[a-z_][a-z0-9_]{0,7}$",
                                  "^\\d{4}-\\d{2}-\\d{2}$",
                                  "^(cat|dog)s?$",
                                  "[0-9]",
                                  "^\\+?[0-9 ()-]{7,12}$",
                                  "^[^,\"]{1,5}$",
                                  "^(?:ab){1,3}c?$",
                                  "^[\u00e0-\u00ff]{1,4}$",
                                  "x$",
                                  "^[\\w.-]{1,6}@[a-z]{2,5}\\.com$"};
        return nlohmann::ordered_json{{"type", "string"}, {"pattern", patterns[pick(11)]}};
      }
      return s;
    }
    case 3: {  // integer
      nlohmann::ordered_json i = {{"type", "integer"}};
      const int64_t lo = static_cast<int64_t>(rng() % 2001) - 1000;
      if (pick(2)) i["minimum"] = lo;
      if (pick(2)) i["maximum"] = lo + static_cast<int64_t>(rng() % 5000);
      if (pick(4) == 0) i["exclusiveMinimum"] = lo - 1;
      if (pick(4) == 0) {
        const double steps[] = {2, 3, 5, 10, 0.5, 25};
        const double step = steps[pick(6)];
        if (step == static_cast<int64_t>(step))
          i["multipleOf"] = static_cast<int64_t>(step);
        else
          i["multipleOf"] = step;
        if (i.contains("maximum") && i["maximum"].get<int64_t>() - lo < 30) i.erase("maximum");
      }
      return i;
    }
    case 4: {  // numbers, bounded on one side, both, or not at all
      nlohmann::ordered_json n = {{"type", "number"}};
      const double values[] = {-2.5, -1, -1e-05, 0, 0.001, 0.5, 1, 99.99, 100, 123.456, 1e6};
      const int a = pick(11), b = a + pick(11 - a);
      if (pick(3) != 0) n[pick(2) ? "minimum" : "exclusiveMinimum"] = values[a];
      if (pick(3) != 0) n[pick(2) || a == b ? "maximum" : "exclusiveMaximum"] = values[b];
      if (n.contains("exclusiveMinimum") && a == b) n.erase("exclusiveMinimum");
      return n;
    }
    case 5:
      return nlohmann::ordered_json{{"type", "boolean"}};
    case 6:
      return pick(2) ? nlohmann::ordered_json{{"type", nlohmann::ordered_json::array({"string", "null"})}}
                     : nlohmann::ordered_json{{"const", nlohmann::ordered_json{{"k", 1}}}};
    case 7:
      return defs_available ? nlohmann::ordered_json{{"$ref", "#/$defs/item"}}
                            : nlohmann::ordered_json{{"enum", {1, "two", nullptr, true}}};
    case 8: {              // array
      if (pick(4) == 0) {  // a tuple
        nlohmann::ordered_json t = {
            {"type", "array"},
            {"prefixItems",
             {random_schema(rng, depth - 1, defs_available), random_schema(rng, depth - 1, defs_available)}}};
        const int rest = pick(3);
        if (rest == 0) t["items"] = false;
        if (rest == 1) t["items"] = random_schema(rng, depth - 1, defs_available);
        if (pick(2)) t["minItems"] = 2;
        if (rest != 0 && pick(2)) t["maxItems"] = 3;
        return t;
      }
      nlohmann::ordered_json a = {{"type", "array"},
                                  {"items", random_schema(rng, depth - 1, defs_available)}};
      if (pick(2)) a["minItems"] = pick(3);
      if (pick(2)) a["maxItems"] = 3 + pick(3);
      return a;
    }
    default:
      return nlohmann::ordered_json{
          {"anyOf",
           {random_schema(rng, depth - 1, defs_available), random_schema(rng, depth - 1, defs_available)}}};
  }
}

/// Runs a script of tests/reference with /usr/bin/python3 on a file: returns (exit code, output).
inline std::pair<int, std::string> run_reference(const std::string& script, const std::string& path) {
  const std::string cmd =
      "/usr/bin/python3 " SWARM_SOURCE_DIR "/tests/reference/" + script + " " + path + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, "cannot run " + cmd};
  std::string output;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) output.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

/// Runs tests/reference/validate_json_documents.py (python3-jsonschema) on a JSONL file of
/// {"schema", "document"} lines: returns (exit code, output); 77 when jsonschema is missing.
inline std::pair<int, std::string> validate_json_documents(const std::string& path) {
  return run_reference("validate_json_documents.py", path);
}

}  // namespace swarm::testing
