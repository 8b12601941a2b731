// swarm-model: inspect and create Hugging Face model directories.
//   swarm-model inspect DIR
//   swarm-model init --from DIR_WITH_CONFIG --out DIR [--seed N] [--dtype bf16|f32]
// Each subcommand is one add_*_command() function; tokenizer / chat-template subcommands
// (tokenize, detokenize, render-chat) plug in the same way.
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "common/error.hpp"
#include "inference/model_tools.hpp"

namespace {

using Action = std::function<void()>;

void add_inspect_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("inspect", "Summarize a model directory (config, tensors, sizes, match)");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("dir", *dir, "Hugging Face model directory")->required();
  cmd->callback([dir, &action] { action = [dir] { std::cout << swarm::inspect_model(*dir) << "\n"; }; });
}

void add_init_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("init", "Create a model directory with random weights from a config.json");
  auto opts = std::make_shared<swarm::InitModelOptions>();
  auto from = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("bf16");
  auto shard_gb = std::make_shared<double>(static_cast<double>(swarm::kDefaultMaxShardBytes) / 1e9);
  cmd->add_option("--from", *from, "Directory with config.json (and tokenizer files to copy)")->required();
  cmd->add_option("--out", *out, "Output directory (created)")->required();
  cmd->add_option("--seed", opts->seed, "Random seed; the same seed gives identical files")
      ->capture_default_str();
  cmd->add_option("--dtype", *dtype, "Weight dtype")
      ->check(CLI::IsMember({"bf16", "f32", "f16"}))
      ->capture_default_str();
  cmd->add_option("--max-shard-gb", *shard_gb, "Shard the weights above this size (GB)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([=, &action] {
    action = [=] {
      opts->from = *from;
      opts->out = *out;
      opts->dtype = *dtype == "f32"   ? swarm::DType::F32
                    : *dtype == "f16" ? swarm::DType::F16
                                      : swarm::DType::BF16;
      opts->max_shard_bytes = static_cast<uint64_t>(*shard_gb * 1e9);
      swarm::ModelWriteResult r = swarm::init_random_model(*opts);
      std::cout << "wrote " << opts->out.string() << ": " << r.files.size() << " weight file"
                << (r.files.size() == 1 ? "" : "s") << (r.sharded ? " + model.safetensors.index.json" : "")
                << ", " << r.tensor_bytes << " bytes of tensors\n";
    };
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"swarm-model: inspect and create Hugging Face model directories"};
  app.require_subcommand(1);
  Action action;
  add_inspect_command(app, action);
  add_init_command(app, action);
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
