#include "client/wire.hpp"

#include <exception>

#include "common/json_nesting.hpp"
#include "swarm/errors.hpp"

namespace swarm::wire {
namespace {

std::string snippet(const std::string& s, size_t max = 300) {
  if (s.size() <= max) return s;
  return s.substr(0, max) + "...";
}

}  // namespace

HttpClient make_http_client(const std::string& url, std::chrono::milliseconds timeout,
                            const std::string& ca_file) {
  if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0)
    throw ConfigError("invalid URL '" + url + "': expected http://host:port[/path]");
  try {
    return HttpClient(url, timeout, ca_file);
  } catch (const std::exception& e) {
    throw ConfigError("invalid URL '" + url + "': " + e.what());
  }
}

HttpClientResponse send(HttpClient& http, const std::string& method, const std::string& path,
                        const std::string& body, const Headers& headers) {
  try {
    return http.request(method, path, body, headers);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    http.close();
    throw TransportError(method + " " + path + ": " + e.what());
  }
}

void throw_if_error_status(int status, const std::string& body) {
  if (status >= 200 && status < 300) return;
  std::string type = "http_error";
  std::string message;
  try {
    const auto j = nlohmann::json::parse(body);
    if (j.is_object() && j.contains("error")) {
      const auto& e = j["error"];
      if (e.is_object()) {
        if (e.contains("type") && e["type"].is_string()) type = e["type"].get<std::string>();
        if (e.contains("message") && e["message"].is_string()) message = e["message"].get<std::string>();
      } else if (e.is_string()) {
        message = e.get<std::string>();
      }
    }
    if (message.empty() && j.is_object() && j.contains("fail_cause") && j["fail_cause"].is_string())
      message = j["fail_cause"].get<std::string>();
  } catch (const std::exception&) {
    // not JSON (a proxy page, ...): report the text itself
  }
  if (message.empty()) message = body.empty() ? "(empty body)" : snippet(body);
  throw ServerError(status, type, message);
}

nlohmann::json parse_body(const std::string& body, const std::string& what) {
  if (!json_nesting_within(body))
    throw ClientError(what + ": response is nested deeper than " + std::to_string(kMaxJsonNesting) +
                      " levels");
  try {
    return nlohmann::json::parse(body);
  } catch (const std::exception& e) {
    throw ClientError(what + ": response is not valid JSON (" + e.what() + "): " + snippet(body));
  }
}

nlohmann::json call_json(HttpClient& http, const std::string& method, const std::string& path,
                         const nlohmann::json* body, const Headers& headers) {
  const auto resp = send(http, method, path, body ? dump_json(*body) : std::string(), headers);
  throw_if_error_status(resp.status, resp.body);
  return parse_body(resp.body, method + " " + path);
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string trim_url(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url;
}

}  // namespace swarm::wire
