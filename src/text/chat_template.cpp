#include "text/chat_template.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.hpp"
#include "common/json_nesting.hpp"
#include "text/jinja/template.hpp"

namespace swarm {

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SwarmError(ErrorKind::INVALID_ARGUMENT, "cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token in tokenizer_config.json: a string, {"content": ...} (AddedToken), or null.
std::string token_text(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return "";
}

// Total bytes of the strings in a JSON value: most of them end up in the rendered prompt.
template <class Json>
size_t string_bytes(const Json& j) {
  if (j.is_string()) return j.template get_ref<const std::string&>().size();
  size_t n = 0;
  if (j.is_array() || j.is_object())
    for (const auto& e : j) n += string_bytes(e);
  return n;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {
  jinja::TemplateOptions options;
  options.trim_blocks = true;
  options.lstrip_blocks = true;
  options.error_prefix = "chat template";
  template_ = std::make_shared<const jinja::Template>(source_, options);
}

ChatTemplate ChatTemplate::from_directory(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  nlohmann::json config = nlohmann::json::object();
  const fs::path config_path = root / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    try {
      const std::string text = read_file(config_path);
      require_json_nesting(text, config_path.string());
      config = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw SwarmError(ErrorKind::INVALID_ARGUMENT, config_path.string() + ": invalid JSON: " + e.what());
    }
  }
  std::string source;
  bool found = false;
  const fs::path jinja_path = root / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    source = read_file(jinja_path);
    found = true;
  } else if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      source = it->get<std::string>();
      found = true;
    } else if (it->is_array()) {
      for (const auto& entry : *it) {
        if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
            entry["template"].is_string()) {
          source = entry["template"].get<std::string>();
          found = true;
        }
      }
      if (!found)
        throw SwarmError(
            ErrorKind::INVALID_ARGUMENT,
            config_path.string() + ": chat_template lists named templates but none is \"default\"");
    } else {
      throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                       config_path.string() + ": chat_template must be a string or a list");
    }
  }
  if (!found)
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     "no chat template in " + dir +
                         " (no chat_template.jinja, no \"chat_template\" in tokenizer_config.json)");
  return ChatTemplate(std::move(source), token_text(config, "bos_token"), token_text(config, "eos_token"));
}

void ChatTemplate::set_clock(std::function<std::chrono::system_clock::time_point()> clock) {
  clock_ = std::move(clock);
}

template <class Json>
std::string ChatTemplate::render_impl(const Json& messages, const Json& tools, bool add_generation_prompt,
                                      const Json& extra_context) const {
  if (!extra_context.is_null() && !extra_context.is_object())
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "chat template extra_context must be a JSON object");
  jinja::Variables vars;
  vars.reserve(8 + (extra_context.is_object() ? extra_context.size() : 0));
  try {
    vars.emplace_back("messages", jinja::from_json(messages));
    vars.emplace_back("tools", jinja::from_json(tools));
  } catch (const jinja::Error& e) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, std::string("chat template input: ") + e.what());
  }
  vars.emplace_back("documents", jinja::Value::none());
  vars.emplace_back("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  // Like HF's special_tokens_map, only tokens that are set are defined.
  if (!bos_token_.empty()) vars.emplace_back("bos_token", jinja::Value::string(bos_token_));
  if (!eos_token_.empty()) vars.emplace_back("eos_token", jinja::Value::string(eos_token_));
  if (extra_context.is_object()) {
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) {
      jinja::Value v;
      try {
        v = jinja::from_json(it.value());
      } catch (const jinja::Error& e) {
        throw SwarmError(ErrorKind::INVALID_ARGUMENT, std::string("chat template input: ") + e.what());
      }
      bool replaced = false;
      for (auto& [name, value] : vars) {
        if (name == it.key()) {
          value = v;
          replaced = true;
        }
      }
      if (!replaced) vars.emplace_back(it.key(), std::move(v));
    }
  }
  const size_t size_hint = string_bytes(messages) + source_.size() + 256;
  return template_->render(vars, clock_, size_hint);
}

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt, const nlohmann::json& extra_context) const {
  return render_impl(messages, tools, add_generation_prompt, extra_context);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                 bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra_context) const {
  return render_impl(messages, tools, add_generation_prompt, extra_context);
}

}  // namespace swarm
