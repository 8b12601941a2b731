#include "trainer/checkpoint_torch.hpp"

#include "model/file_io.hpp"

#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/error.hpp"
#include "inference/decoder_model_torch.hpp"
#include "model/model_tools.hpp"
#include "model/safetensors_torch.hpp"
#include "trainer/policy_trainer_torch.hpp"

namespace swarm {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

DType dtype_of(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat:
      return DType::F32;
    case torch::kBFloat16:
      return DType::BF16;
    case torch::kDouble:
      return DType::F64;
    case torch::kHalf:
      return DType::F16;
    default:
      throw SwarmError(ErrorKind::INTERNAL, "cannot save a tensor of this dtype");
  }
}

// CPU, contiguous copies (kept alive in `keep`) and the TensorData views over them.
std::vector<TensorData> as_tensor_data(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                                       std::vector<torch::Tensor>& keep) {
  std::vector<TensorData> out;
  keep.reserve(named.size());
  for (const auto& [name, t] : named) {
    keep.push_back(t.detach().to(torch::kCPU).contiguous());
    const torch::Tensor& c = keep.back();
    TensorData d;
    d.name = name;
    d.dtype = dtype_of(c);
    d.shape = c.sizes().vec();
    d.bytes = std::span<const std::byte>(static_cast<const std::byte*>(c.data_ptr()), c.nbytes());
    out.push_back(std::move(d));
  }
  return out;
}

std::string shard_file_name(int rank, int world) {
  return "optimizer-rank" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}

void write_named(const fs::path& file, const std::map<std::string, torch::Tensor>& state) {
  std::vector<std::pair<std::string, torch::Tensor>> named(state.begin(), state.end());
  std::vector<torch::Tensor> keep;
  write_safetensors(file, as_tensor_data(named, keep));
}

std::map<std::string, torch::Tensor> read_named(const fs::path& file, const std::string& what) {
  SWARM_REQUIRE(fs::exists(file), ErrorKind::INVALID_ARGUMENT,
                "no " + what + " " + file.string() +
                    " (was the checkpoint written with another number of ranks" + " or another algorithm?)");
  std::map<std::string, torch::Tensor> state;
  for (const auto& [name, t] : load_state_dict(file)) state[name] = t.clone();
  return state;
}

}  // namespace

void save_hf_model(const fs::path& dir, const DecoderModel& model, const fs::path& source_dir) {
  fs::create_directories(dir);
  std::vector<torch::Tensor> keep;
  const auto data = as_tensor_data(model.parameters(), keep);
  write_safetensors_model(dir, data);

  std::ifstream in(source_dir / "config.json");
  SWARM_REQUIRE(in.good(), ErrorKind::INVALID_ARGUMENT, "no config.json in " + source_dir.string());
  json config = json::parse(in);
  config["torch_dtype"] = model.scalar_type() == torch::kBFloat16 ? "bfloat16" : "float32";
  write_text_file_atomic(dir / "config.json", config.dump(2) + "\n");  // a full disk says so
  std::vector<std::string> extra = tokenizer_file_names();
  extra.push_back("generation_config.json");
  for (const std::string& name : extra) {
    if (fs::exists(source_dir / name))
      fs::copy_file(source_dir / name, dir / name, fs::copy_options::overwrite_existing);
  }
}

void save_trainer_state(const fs::path& dir, const PolicyTrainer& trainer) {
  fs::create_directories(dir);
  const Collectives& comm = trainer.collectives();
  write_named(dir / shard_file_name(comm.rank(), comm.world_size()), trainer.optimizer_state());
  if (const Critic* critic = trainer.critic()) {  // PPO: the critic's weights and its optimizer shard
    write_named(dir / ("critic-" + shard_file_name(comm.rank(), comm.world_size())),
                critic->parameters().state());
    if (comm.rank() == 0) write_named(dir / "critic.safetensors", critic->weights());
  }
  if (comm.rank() == 0) {
    const TrainerOptions& o = trainer.options();
    const json j = {{"format", "swarm-trainer-state-1"},
                    {"world_size", comm.world_size()},
                    {"optimizer_steps", trainer.optimizer_steps()},
                    {"parameters", trainer.parameter_count()},
                    {"optimizer", "adamw"},
                    {"critic", trainer.critic() != nullptr},
                    {"adam_beta1", o.adam_beta1},
                    {"adam_beta2", o.adam_beta2},
                    {"adam_eps", o.adam_eps},
                    {"rng", "none: the trainer draws no random numbers (sampling seeds are per request)"}};
    write_text_file_atomic(dir / "trainer_state.json", j.dump(2) + "\n");
  }
}

void load_trainer_state(const fs::path& dir, PolicyTrainer& trainer) {
  auto& comm = trainer.collectives();
  trainer.load_optimizer_state(
      read_named(dir / shard_file_name(comm.rank(), comm.world_size()), "trainer state"));
  if (Critic* critic = trainer.critic()) {
    critic->load_weights(read_named(dir / "critic.safetensors", "critic weights"));
    critic->parameters().load_state(
        read_named(dir / ("critic-" + shard_file_name(comm.rank(), comm.world_size())),
                   "critic optimizer state"),
        "critic optimizer state");
  }
}

}  // namespace swarm
