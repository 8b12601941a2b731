#include "trainer/critic_torch.hpp"

#include <torch/torch.h>

#include "common/error.hpp"
#include "inference/decoder_model_torch.hpp"

namespace swarm {
namespace {

// `trunk` (a model's parameters) and a zero value head for a model of hidden size `hidden`.
NamedTensors with_value_head(const NamedTensors& trunk, int64_t hidden, torch::TensorOptions opts) {
  NamedTensors out(trunk.begin(), trunk.end());
  out.emplace_back("value_head.weight", torch::zeros({hidden}, opts));
  out.emplace_back("value_head.bias", torch::zeros({1}, opts));
  return out;
}

}  // namespace

void ValueLossSums::add(const ValueLossSums& o) {
  loss += o.loss;
  clipped += o.clipped;
  value_sum += o.value_sum;
  error_sum += o.error_sum;
  tokens += o.tokens;
}

Critic::Critic(const DecoderModel& trunk, std::shared_ptr<Collectives> comm,
               const NamedTensors* master_values, bool fp32_compute, const ShardingOptions& sharding)
    : storage_(trunk.scalar_type()) {
  torch::NoGradGuard no_grad;
  const int64_t hidden = trunk.config().hidden_size;
  const auto on_device = torch::TensorOptions().device(trunk.device());
  const auto initial = with_value_head(trunk.parameters(), hidden, on_device.dtype(trunk.scalar_type()));
  NamedTensors master;
  if (master_values != nullptr)
    master = with_value_head(*master_values, hidden, on_device.dtype(torch::kFloat));
  const torch::ScalarType compute = fp32_compute ? torch::kFloat : trunk.scalar_type();
  params_ = std::make_unique<FlatParameters>(initial, compute, trunk.device(), std::move(comm),
                                             master_values != nullptr ? &master : nullptr, sharding);
  // Trained in fp32 from a bf16 model: the checkpoint's critic file holds the weights rounded,
  // so the optimizer state keeps the masters.
  params_->set_master_in_state(fp32_compute && storage_ != torch::kFloat);
  trunk_params_ = trunk.parameters().size();
  std::vector<torch::Tensor> leaves = params_->leaves();
  head_w_ = leaves[trunk_params_];
  head_b_ = leaves[trunk_params_ + 1];
  leaves.resize(trunk_params_);
  trunk_ = trunk.with_parameters(std::move(leaves),
                                 fp32_compute ? std::optional<DType>(DType::F32) : std::nullopt);
}

Critic::~Critic() = default;

torch::Tensor Critic::values(const torch::Tensor& ids, const torch::Tensor& lengths,
                             const torch::Tensor& positions) {
  return values(padded_tokens(ids, lengths), positions, TrainingForward{TrainingAttention::EAGER, false});
}

ValueLossSums Critic::accumulate_gradients(const torch::Tensor& ids, const torch::Tensor& lengths,
                                           const torch::Tensor& positions, const torch::Tensor& returns,
                                           const torch::Tensor& old_values, const torch::Tensor& weight,
                                           double norm, double cliprange) {
  return accumulate_gradients(padded_tokens(ids, lengths), positions, returns, old_values, weight, norm,
                              cliprange, TrainingForward{TrainingAttention::EAGER, false});
}

torch::Tensor Critic::values(const TrainingTokens& tokens, const torch::Tensor& positions,
                             const TrainingForward& how) {
  return values_of(*trunk_, head_w_, head_b_, tokens, positions, how);
}

torch::Tensor Critic::values_of(const DecoderModel& trunk, const torch::Tensor& head_w,
                                const torch::Tensor& head_b, const TrainingTokens& tokens,
                                const torch::Tensor& positions, const TrainingForward& how) {
  const torch::Tensor hidden = trunk.final_hidden(tokens, how);  // [N, H] or [B, T, H]
  const torch::Tensor h = hidden.reshape({-1, hidden.size(-1)}).index_select(0, positions);
  const torch::Tensor x = trunk.final_norm(h).to(torch::kFloat);
  return at::matmul(x, head_w.to(torch::kFloat)) + head_b.to(torch::kFloat);  // [N]
}

ValueLossSums Critic::accumulate_gradients(const TrainingTokens& tokens, const torch::Tensor& positions,
                                           const torch::Tensor& returns, const torch::Tensor& old_values,
                                           const torch::Tensor& weight, double norm, double cliprange,
                                           const TrainingForward& how) {
  SWARM_REQUIRE(norm > 0, ErrorKind::INVALID_ARGUMENT, "value loss normaliser must be > 0");
  // The parameters through gradient sinks: their gradients go to the flat buffers (or, sharded,
  // to the other ranks) as the backward produces them, never to the leaves.
  std::vector<torch::Tensor> sinks;
  for (const auto& [name, leaf] : trunk_->parameters()) sinks.push_back(leaf);
  sinks.push_back(head_w_);
  sinks.push_back(head_b_);
  sinks = params_->gradient_sinks(sinks);
  const torch::Tensor head_w = sinks[trunk_params_], head_b = sinks[trunk_params_ + 1];
  sinks.resize(trunk_params_);
  const std::shared_ptr<DecoderModel> trunk = trunk_->with_parameters(std::move(sinks));
  const torch::Tensor v = values_of(*trunk, head_w, head_b, tokens, positions, how);
  SWARM_CHECK(v.numel() == returns.numel() && v.numel() == old_values.numel(),
              "critic: values, returns and old values differ in length");
  const torch::Tensor clipped_v = old_values + torch::clamp(v - old_values, -cliprange, cliprange);
  const torch::Tensor l1 = (v - returns).square();
  const torch::Tensor l2 = (clipped_v - returns).square();
  const torch::Tensor per_token = 0.5 * torch::maximum(l1, l2);
  const torch::Tensor loss = (per_token * (weight / norm)).sum();
  loss.backward();
  params_->finish_micro_batch();
  torch::NoGradGuard no_grad;
  ValueLossSums s;
  s.loss = loss.item<double>();
  s.clipped = (l2.detach() > l1.detach()).sum().item<double>();
  s.value_sum = v.detach().sum().item<double>();
  s.error_sum = l1.detach().sum().item<double>();
  s.tokens = static_cast<double>(v.numel());
  return s;
}

std::map<std::string, torch::Tensor> Critic::weights() const {
  std::map<std::string, torch::Tensor> out;
  for (size_t i = 0; i < params_->size(); ++i) out[params_->name(i)] = params_->view(i).to(storage_);
  return out;
}

void Critic::load_weights(const std::map<std::string, torch::Tensor>& named) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_->size(); ++i) {
    auto it = named.find(params_->name(i));
    SWARM_REQUIRE(it != named.end(), ErrorKind::INVALID_ARGUMENT,
                  "critic weights have no '" + params_->name(i) + "'");
    torch::Tensor dst = params_->view(i);
    SWARM_REQUIRE(it->second.sizes() == dst.sizes(), ErrorKind::INVALID_ARGUMENT,
                  "critic weight '" + params_->name(i) + "' has the wrong shape");
    dst.copy_(it->second);
  }
}

}  // namespace swarm
