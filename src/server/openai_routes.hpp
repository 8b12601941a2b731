// OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models.
#pragma once

#include <memory>

#include "engine/engine.hpp"
#include "server/http_types.hpp"
#include "server/metrics.hpp"

namespace swarm {

enum class OpenAIKind { CHAT, COMPLETION };

/// GET /v1/models: the loaded model (empty list when no model is loaded).
HttpResponse openai_models(Engine& engine);

/// Serves one chat/completion request: authenticates the episode key, validates the
/// parameters, renders the prompt, generates (streaming or not), records the exact
/// prompt/completion ids and log-probs into the episode, and answers through `sink`.
/// Throws SwarmError for errors found before generation starts; later errors are
/// answered through the sink.
void serve_generation(Engine& engine, Metrics& metrics, OpenAIKind kind, const HttpRequest& request,
                      std::shared_ptr<ResponseSink> sink);

}  // namespace swarm
