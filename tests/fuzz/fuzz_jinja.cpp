// libFuzzer target: the Jinja interpreter (src/text/jinja/) on an arbitrary template, as a chat
// template from a model directory is untrusted input. Parsing and rendering (with a chat-like
// context: messages, tools, flags) must end in output or a SwarmError naming line and column,
// never a crash, another exception or runaway memory.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include <nlohmann/json.hpp>

#include "text/jinja/template.hpp"

namespace {

swarm::jinja::Variables context() {
  using swarm::jinja::Value;
  const auto j = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": "Hi <b>&</b> \u00e9"},
                 {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                   "function": {"name": "add", "arguments": {"a": 1, "b": 2.5}}}]},
                 {"role": "tool", "content": "3.5"}],
    "tools": [{"type": "function", "function": {"name": "add", "description": "Adds",
               "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]})");
  return {{"messages", swarm::jinja::from_json(j["messages"])},
          {"tools", swarm::jinja::from_json(j["tools"])},
          {"add_generation_prompt", Value::boolean(true)},
          {"bos_token", Value::string("<s>")},
          {"eos_token", Value::string("</s>")}};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const swarm::jinja::Variables vars = context();
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    swarm::jinja::Template t(source);
    const std::string out = t.render(vars, [] { return std::chrono::system_clock::time_point{}; });
    (void)out;
  } catch (const swarm::SwarmError&) {
    return 0;
  } catch (...) {
    std::abort();
  }
  return 0;
}
