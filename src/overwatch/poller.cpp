#include "overwatch/poller.hpp"

#include <stdexcept>

#include "http/http_client.hpp"
#include "swarm/errors.hpp"

namespace swarm::overwatch {
namespace {

constexpr const char* kPoolRoute = "/get_current_batch_rollout_pool_information";

// The server's JSON error message when there is one, else the start of the body.
std::string describe_error_body(const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  std::string s = body.substr(0, 120);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

std::string normalize_url(std::string url) {
  while (url.size() > 1 && url.back() == '/') url.pop_back();
  return url;
}

Poller::Poller(std::string base_url, std::chrono::milliseconds timeout)
    : url_(normalize_url(std::move(base_url))) {
  try {
    http_ = std::make_unique<HttpClient>(url_, timeout);
  } catch (const TransportError& e) {
    throw std::invalid_argument(e.what());
  }
}

Poller::~Poller() = default;

PollResult Poller::poll() {
  PollResult result;
  Snapshot snap;
  try {
    const HttpClientResponse r = http_->request("GET", kPoolRoute);
    if (r.status != 200) {
      result.error =
          "HTTP " + std::to_string(r.status) + " from " + kPoolRoute + ": " + describe_error_body(r.body);
      return result;
    }
    snap.pool = parse_pool_information(r.body);
  } catch (const Error& e) {
    http_->close();  // start the next attempt on a fresh connection
    result.error = e.what();
    return result;
  } catch (const std::exception& e) {
    result.error = e.what();
    return result;
  }
  // The extras: a failure here does not make the server unreachable.
  try {
    const HttpClientResponse r = http_->request("GET", "/get_engine_status");
    if (r.status == 200) snap.engine = parse_engine_status(r.body);
  } catch (const Error&) {
    http_->close();
  } catch (const std::exception&) {}
  try {
    const HttpClientResponse r = http_->request("GET", "/metrics");
    if (r.status == 200) snap.requests = request_stats_from_metrics(r.body);
  } catch (const Error&) {
    http_->close();
  } catch (const std::exception&) {}
  result.snapshot = std::move(snap);
  return result;
}

}  // namespace swarm::overwatch
