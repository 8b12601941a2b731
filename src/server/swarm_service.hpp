// The application behind the HTTP transport: command routes and OpenAI routes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/engine.hpp"
#include "server/http_types.hpp"
#include "server/metrics.hpp"

namespace swarm {

/// Routes requests to the engine. Thread-safe (stateless apart from the engine and
/// metrics, which are). Never throws out of handle(): every error becomes a response.
class SwarmService {
 public:
  /// `fallback_authority` ("host:port") builds openai_base_url when a request has no
  /// Host header.
  SwarmService(Engine& engine, Metrics& metrics, std::function<std::string()> fallback_authority);

  void handle(HttpRequest&& request, std::shared_ptr<ResponseSink> sink);

 private:
  HttpResponse handle_command(const std::string& route, const HttpRequest& request);
  void handle_openai(const std::string& route, HttpRequest&& request, std::shared_ptr<ResponseSink> sink);

  Engine& engine_;
  Metrics& metrics_;
  std::function<std::string()> fallback_authority_;
};

}  // namespace swarm
