// Private helpers shared by SwarmClient and OpenAIClient: HTTP calls with the SDK's error
// mapping (no transport or JSON exception escapes), JSON parsing of bodies.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "http/http_client.hpp"

namespace swarm::wire {

using Headers = std::vector<std::pair<std::string, std::string>>;

/// Constructs an HttpClient, turning a malformed URL or an unreadable CA file into ConfigError.
HttpClient make_http_client(const std::string& url, std::chrono::milliseconds timeout,
                            const std::string& ca_file = {});

/// Sends a request; any non-ClientError exception from the transport becomes
/// TransportError. Returns the raw response (any status).
HttpClientResponse send(HttpClient& http, const std::string& method, const std::string& path,
                        const std::string& body, const Headers& headers = {});

/// Throws ServerError(status, type, message) for a non-2xx response, taking type and
/// message from a `{"error": {...}}` body when there is one.
void throw_if_error_status(int status, const std::string& body);

/// Parses a 2xx body as JSON; ClientError if it is not JSON.
nlohmann::json parse_body(const std::string& body, const std::string& what);

/// send + throw_if_error_status + parse_body.
nlohmann::json call_json(HttpClient& http, const std::string& method, const std::string& path,
                         const nlohmann::json* body, const Headers& headers = {});

/// Serialises JSON compactly; invalid UTF-8 in strings is replaced, never thrown.
std::string dump_json(const nlohmann::json& j);

/// Strips trailing slashes from a URL.
std::string trim_url(std::string url);

}  // namespace swarm::wire
