// Chat templates: a model's Jinja template rendered exactly as Hugging Face's
// tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace swarm {

namespace jinja {
class Template;
}  // namespace jinja

/// A parsed chat template plus the special tokens it may reference.
///
/// Thread-safety: render() is const and safe to call concurrently; set_clock() must not race
/// with render() (call it before sharing the object). Copies share the parsed template.
class ChatTemplate {
 public:
  /// Parses once; throws SwarmError(INVALID_ARGUMENT) with line/column on syntax errors.
  ChatTemplate(std::string source, std::string bos_token = "", std::string eos_token = "");

  /// From a model/tokenizer directory: chat_template.jinja if present, else the
  /// tokenizer_config.json "chat_template" (a string, or a list of {name, template} from which
  /// the "default" one is taken); bos/eos tokens from tokenizer_config.json (a string or
  /// {"content": ...}). Throws SwarmError(INVALID_ARGUMENT) if there is no template.
  static ChatTemplate from_directory(const std::string& dir);

  /// HF apply_chat_template(messages, tools=tools, add_generation_prompt=..., **extra) with
  /// tokenize=False. messages/tools are OpenAI-request JSON (tools null → None);
  /// extra_context adds or overrides variables (e.g. {"enable_thinking": false}).
  /// The template sees messages, tools, documents (None), add_generation_prompt, bos_token and
  /// eos_token (when non-empty), raise_exception and strftime_now.
  /// Throws SwarmError(INVALID_ARGUMENT) naming line and column on template errors
  /// (including raise_exception, whose message is kept verbatim).
  /// Note: nlohmann::json objects iterate in sorted key order, so `tojson` of them prints keys
  /// sorted; use the ordered_json overload to keep the request's key order like Python does.
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools = nullptr,
                     bool add_generation_prompt = true,
                     const nlohmann::json& extra_context = nlohmann::json::object()) const;

  /// Same, keeping object key order (byte-exact with Python for `tojson` of tools/arguments).
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools = nullptr,
                     bool add_generation_prompt = true,
                     const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

  /// Replaces the wall clock behind strftime_now (default: the system clock, local time).
  void set_clock(std::function<std::chrono::system_clock::time_point()> clock);

 private:
  template <class Json>
  std::string render_impl(const Json& messages, const Json& tools, bool add_generation_prompt,
                          const Json& extra_context) const;

  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  std::shared_ptr<const jinja::Template> template_;
  std::function<std::chrono::system_clock::time_point()> clock_;
};

}  // namespace swarm
