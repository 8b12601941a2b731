// Raw HTTP + JSON helpers for the integration tests that speak the wire protocol without the
// SDK (test_wire_protocol, test_bad_input): headers, JSON bodies, GET/POST with the expected
// status checked. GoogleTest expectations report what went wrong; nothing throws.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "http/http_client.hpp"

namespace swarm::testing {

using Headers = std::vector<std::pair<std::string, std::string>>;

/// A response header by its lower-case name, "" when absent.
inline std::string header_of(const HttpClientResponse& r, const std::string& name) {
  for (const auto& [k, v] : r.headers)
    if (k == name) return v;
  return "";
}

/// The body as JSON; a body that is not JSON fails the test (and gives a discarded value).
inline nlohmann::json parse_body(const HttpClientResponse& r) {
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << r.body;
  return j;
}

/// POST `body` as application/json, as it is (it may be malformed on purpose).
inline HttpClientResponse post_raw(HttpClient& c, const std::string& path, const std::string& body,
                                   const Headers& headers = {}) {
  return c.request("POST", path, body, headers, "application/json");
}

/// GET `path`: expects 200 and a JSON content type; returns the body.
inline nlohmann::json get_json(HttpClient& c, const std::string& path) {
  auto r = c.request("GET", path);
  EXPECT_EQ(r.status, 200) << path << ": " << r.body;
  EXPECT_NE(header_of(r, "content-type").find("application/json"), std::string::npos) << path;
  return parse_body(r);
}

/// POST `body`: expects `expected_status`; returns the body.
inline nlohmann::json post_json(HttpClient& c, const std::string& path, const nlohmann::json& body,
                                int expected_status = 200, const Headers& headers = {}) {
  auto r = post_raw(c, path, body.dump(), headers);
  EXPECT_EQ(r.status, expected_status) << path << ": " << r.body;
  return parse_body(r);
}

/// The header an episode's OpenAI calls carry.
inline Headers bearer(const std::string& api_key) { return {{"Authorization", "Bearer " + api_key}}; }

}  // namespace swarm::testing
