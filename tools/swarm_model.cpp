// swarm-model: inspect and create Hugging Face model directories.
//   swarm-model inspect DIR
//   swarm-model init --from DIR_WITH_CONFIG --out DIR [--seed N] [--dtype bf16|f32] [--set KEY=VALUE ...]
//   swarm-model init --preset tiny-char --out DIR [--seed N] [--dtype bf16|f32] [--set KEY=VALUE ...]
//   swarm-model tokenize --model DIR [--text T] [--no-special]     (text on stdin otherwise)
//   swarm-model detokenize --model DIR [--skip-special]            (JSON ids on stdin)
//   swarm-model render-chat --model DIR FILE.json
// Each subcommand is one add_*_command() function.
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "model/model_tools.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

namespace {

using Action = std::function<void()>;

void add_inspect_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("inspect", "Summarize a model directory (config, tensors, sizes, match)");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("dir", *dir, "Hugging Face model directory")->required();
  cmd->callback([dir, &action] { action = [dir] { std::cout << swarm::inspect_model(*dir) << "\n"; }; });
}

void add_init_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "init",
      "Create a model directory with random weights from a config.json (--from) or a preset (--preset)");
  auto opts = std::make_shared<swarm::InitModelOptions>();
  auto from = std::make_shared<std::string>();
  auto preset = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("bf16");
  auto shard_gb = std::make_shared<double>(static_cast<double>(swarm::kDefaultMaxShardBytes) / 1e9);
  auto* from_opt =
      cmd->add_option("--from", *from, "Directory with config.json (and tokenizer files to copy)");
  std::string presets;
  for (const auto& name : swarm::model_preset_names()) presets += (presets.empty() ? "" : ", ") + name;
  auto* preset_opt = cmd->add_option("--preset", *preset,
                                     "A built-in model with its own tokenizer instead of --from (" + presets +
                                         "; tiny-char: ~1M-parameter Llama, character-level tokenizer)");
  from_opt->excludes(preset_opt);
  preset_opt->excludes(from_opt);
  cmd->add_option("--out", *out, "Output directory (created)")->required();
  cmd->add_option("--seed", opts->seed, "Random seed; the same seed gives identical files")
      ->capture_default_str();
  cmd->add_option("--dtype", *dtype, "Weight dtype")
      ->check(CLI::IsMember({"bf16", "f32", "f16"}))
      ->capture_default_str();
  auto sets = std::make_shared<std::vector<std::string>>();
  cmd->add_option("--set", *sets,
                  "Override a config.json key, KEY=VALUE (VALUE is JSON, else a string); repeatable, "
                  "e.g. --set hidden_size=64 --set num_hidden_layers=2");
  cmd->add_option("--max-shard-gb", *shard_gb, "Shard the weights above this size (GB)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([=, &action] {
    action = [=] {
      if (from->empty() && preset->empty())
        throw swarm::SwarmError(swarm::ErrorKind::INVALID_ARGUMENT,
                                "init needs --from DIR (a directory with config.json) or --preset NAME");
      opts->from = *from;
      opts->preset = *preset;
      opts->out = *out;
      opts->dtype = *dtype == "f32"   ? swarm::DType::F32
                    : *dtype == "f16" ? swarm::DType::F16
                                      : swarm::DType::BF16;
      opts->max_shard_bytes = static_cast<uint64_t>(*shard_gb * 1e9);
      opts->config_overrides.clear();
      for (const auto& kv : *sets) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos || eq == 0)
          throw swarm::SwarmError(swarm::ErrorKind::INVALID_ARGUMENT,
                                  "--set expects KEY=VALUE, got '" + kv + "'");
        opts->config_overrides.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
      }
      swarm::ModelWriteResult r = swarm::init_random_model(*opts);
      std::cout << "wrote " << opts->out.string() << ": " << r.files.size() << " weight file"
                << (r.files.size() == 1 ? "" : "s") << (r.sharded ? " + model.safetensors.index.json" : "")
                << ", " << r.tensor_bytes << " bytes of tensors\n";
    };
  });
}

std::string read_all(std::istream& in) { return {std::istreambuf_iterator<char>(in), {}}; }

void add_tokenize_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("tokenize", "Text -> JSON array of token ids (text from --text or stdin)");
  auto dir = std::make_shared<std::string>();
  auto text = std::make_shared<std::string>();
  auto no_special = std::make_shared<bool>(false);
  cmd->add_option("--model", *dir, "Model or tokenizer directory (tokenizer.json)")->required();
  auto* text_opt = cmd->add_option("--text", *text, "Text to encode (default: read stdin)");
  cmd->add_flag("--no-special", *no_special, "Do not add bos/eos (add_special_tokens=False)");
  cmd->callback([=, &action] {
    action = [=] {
      auto tok = swarm::Tokenizer::from_directory(*dir);
      const std::string input = text_opt->count() ? *text : read_all(std::cin);
      std::cout << nlohmann::json(tok->encode(input, !*no_special)).dump() << "\n";
    };
  });
}

void add_detokenize_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("detokenize", "JSON array of token ids on stdin -> text");
  auto dir = std::make_shared<std::string>();
  auto skip_special = std::make_shared<bool>(false);
  cmd->add_option("--model", *dir, "Model or tokenizer directory (tokenizer.json)")->required();
  cmd->add_flag("--skip-special", *skip_special, "Leave special tokens out of the text");
  cmd->callback([=, &action] {
    action = [=] {
      auto tok = swarm::Tokenizer::from_directory(*dir);
      nlohmann::json ids = nlohmann::json::parse(read_all(std::cin), nullptr, false);
      if (ids.is_discarded() || !ids.is_array())
        throw swarm::SwarmError(swarm::ErrorKind::INVALID_ARGUMENT,
                                "stdin must be a JSON array of token ids");
      std::vector<swarm::TokenId> v;
      for (const auto& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tok->vocab_size())
          throw swarm::SwarmError(swarm::ErrorKind::INVALID_ARGUMENT,
                                  "token id " + id.dump() + " is not in the vocabulary (size " +
                                      std::to_string(tok->vocab_size()) + ")");
        v.push_back(id.get<swarm::TokenId>());
      }
      std::cout << tok->decode(v, *skip_special);
    };
  });
}

void add_render_chat_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand(
      "render-chat",
      "Render an OpenAI-style request {messages, tools, add_generation_prompt, ...} with the model's chat "
      "template -> {prompt, ids}");
  auto dir = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>();
  cmd->add_option("--model", *dir, "Model or tokenizer directory")->required();
  cmd->add_option("file", *file, "JSON request file")->required()->check(CLI::ExistingFile);
  cmd->callback([=, &action] {
    action = [=] {
      std::ifstream in(*file);
      // ordered_json keeps the request's key order, as Python's json does for tojson.
      nlohmann::ordered_json req = nlohmann::ordered_json::parse(read_all(in), nullptr, false);
      if (req.is_discarded() || !req.is_object())
        throw swarm::SwarmError(swarm::ErrorKind::INVALID_ARGUMENT, *file + ": not a JSON object");
      if (!req.contains("messages") || !req["messages"].is_array())
        throw swarm::SwarmError(swarm::ErrorKind::INVALID_ARGUMENT, *file + ": needs a 'messages' array");
      const bool add_generation_prompt = req.value("add_generation_prompt", true);
      nlohmann::ordered_json tools = req.contains("tools") ? req["tools"] : nlohmann::ordered_json();
      nlohmann::ordered_json extra = nlohmann::ordered_json::object();
      for (auto it = req.begin(); it != req.end(); ++it)
        if (it.key() != "messages" && it.key() != "tools" && it.key() != "add_generation_prompt")
          extra[it.key()] = it.value();  // e.g. enable_thinking
      auto tmpl = swarm::ChatTemplate::from_directory(*dir);
      auto tok = swarm::Tokenizer::from_directory(*dir);
      const std::string prompt = tmpl.render(req["messages"], tools, add_generation_prompt, extra);
      // As apply_chat_template(tokenize=True): the template already placed bos/eos.
      nlohmann::ordered_json out = {{"prompt", prompt}, {"ids", tok->encode(prompt, false)}};
      std::cout << out.dump() << "\n";
    };
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swarm-model: inspect, create, tokenize and chat-render Hugging Face model directories"};
  app.require_subcommand(1);
  Action action;
  add_inspect_command(app, action);
  add_init_command(app, action);
  add_tokenize_command(app, action);
  add_detokenize_command(app, action);
  add_render_chat_command(app, action);
  CLI11_PARSE(app, argc, argv);
  try {
    action();
  } catch (const swarm::SwarmError& e) {
    std::fprintf(stderr, "swarm-model: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "swarm-model: unexpected error: %s\n", e.what());
    return 1;
  }
  return 0;
}
