#include "trainer/flat_parameters_torch.hpp"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/error.hpp"

namespace swarm {
namespace {

// Elements per chunk of the flat-buffer passes (gradient accumulation, AdamW): 4 MiB in fp32,
// cache-sized while keeping the number of (OpenMP-parallel) ops per step small.
constexpr int64_t kFlatChunk = int64_t{1} << 20;

// dst (fp32) += src (any floating dtype), in chunks: on the CPU a mixed-dtype add_ converts the
// whole of src to fp32 first (a full-size temporary per parameter); chunk by chunk the
// conversion stays small and in cache. Same sums, element by element.
void add_in_chunks(torch::Tensor dst, const torch::Tensor& src) {
  const torch::Tensor flat = src.reshape(-1);
  const int64_t n = flat.numel();
  if (flat.scalar_type() == dst.scalar_type() || n <= kFlatChunk || !dst.is_cpu()) {
    dst.add_(flat);
    return;
  }
  for (int64_t off = 0; off < n; off += kFlatChunk) {
    const int64_t len = std::min(kFlatChunk, n - off);
    dst.narrow(0, off, len).add_(flat.narrow(0, off, len));
  }
}

}  // namespace

FlatParameters::FlatParameters(const std::vector<std::pair<std::string, torch::Tensor>>& initial,
                               torch::ScalarType compute, torch::Device device,
                               std::shared_ptr<Collectives> comm,
                               const std::vector<std::pair<std::string, torch::Tensor>>* master_init)
    : comm_(std::move(comm)) {
  SWARM_CHECK(comm_ != nullptr, "FlatParameters needs collectives");
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : initial) {
    names_.push_back(name);
    shapes_.push_back(t.sizes().vec());
    offsets_.push_back(numel_);
    numel_ += t.numel();
  }
  const int64_t world = comm_->world_size();
  shard_ = (numel_ + world - 1) / world;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  weights_ = torch::zeros({shard_ * world}, torch::TensorOptions().dtype(compute).device(device));
  // Copies a parameter list (these names and sizes, in order) into a flat buffer.
  const auto fill = [&](torch::Tensor& flat, const std::vector<std::pair<std::string, torch::Tensor>>& list) {
    SWARM_REQUIRE(list.size() == initial.size(), ErrorKind::INVALID_ARGUMENT,
                  "master weights have a different parameter list");
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& [name, t] = list[i];
      SWARM_REQUIRE(name == names_[i] && t.numel() == initial[i].second.numel(), ErrorKind::INVALID_ARGUMENT,
                    "master weights parameter '" + name + "' does not match");
      flat.narrow(0, offsets_[i], t.numel()).copy_(t.reshape(-1));
    }
  };
  // fp32 weights start from the fp32 masters when given (a bf16 model trained in fp32 must not
  // start from its rounded weights), else from the initial values.
  fill(weights_, compute == torch::kFloat && master_init != nullptr ? *master_init : initial);
  grad_ = torch::zeros({shard_ * world}, f32);

  const int64_t begin = comm_->rank() * shard_;
  if (world == 1 && compute == torch::kFloat) {
    master_ = weights_;  // the fp32 weights are their own master copy
  } else if (master_init != nullptr && compute != torch::kFloat) {  // fp32 weights hold the masters already
    // This rank's shard only, parameter slice by parameter slice: no full fp32 temporary.
    master_ = torch::zeros({shard_}, f32);
    const int64_t end = begin + shard_;
    SWARM_REQUIRE(master_init->size() == initial.size(), ErrorKind::INVALID_ARGUMENT,
                  "master weights have a different parameter list");
    for (size_t i = 0; i < master_init->size(); ++i) {
      const auto& [name, t] = (*master_init)[i];
      SWARM_REQUIRE(name == names_[i] && t.numel() == initial[i].second.numel(), ErrorKind::INVALID_ARGUMENT,
                    "master weights parameter '" + name + "' does not match");
      const int64_t lo = std::max(begin, offsets_[i]), hi = std::min(end, offsets_[i] + t.numel());
      if (lo >= hi) continue;
      master_.narrow(0, lo - begin, hi - lo).copy_(t.reshape(-1).narrow(0, lo - offsets_[i], hi - lo));
    }
  } else {
    master_ = weights_.narrow(0, begin, shard_).to(torch::kFloat).clone();
  }
  exp_avg_ = torch::zeros({shard_}, f32);
  exp_avg_sq_ = torch::zeros({shard_}, f32);
}

torch::Tensor FlatParameters::view(size_t i) const {
  int64_t n = 1;
  for (int64_t d : shapes_[i]) n *= d;
  return weights_.narrow(0, offsets_[i], n).view(shapes_[i]);
}

std::vector<torch::Tensor> FlatParameters::leaves() const {
  std::vector<torch::Tensor> out;
  out.reserve(names_.size());
  for (size_t i = 0; i < names_.size(); ++i) out.push_back(view(i).detach().requires_grad_(true));
  return out;
}

void FlatParameters::accumulate(size_t i, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  add_in_chunks(grad_.narrow(0, offsets_[i], grad.numel()), grad);
}

void FlatParameters::zero_gradients() { grad_.zero_(); }

torch::Tensor FlatParameters::gradient(size_t i) const {
  int64_t n = 1;
  for (int64_t d : shapes_[i]) n *= d;
  return grad_.narrow(0, offsets_[i], n).view(shapes_[i]);
}

double FlatParameters::step(double lr, const AdamWOptions& o) {
  torch::NoGradGuard no_grad;
  const int world = comm_->world_size();
  torch::Tensor g = grad_;
  if (world > 1) {
    g = torch::empty({shard_}, grad_.options());
    comm_->reduce_scatter_sum(grad_, g);
  }
  // Sum of squares chunk by chunk (no full-size temporary), accumulated in double.
  const int64_t chunk = g.is_cpu() ? kFlatChunk : std::max<int64_t>(shard_, 1);
  torch::Tensor sq = torch::zeros({1}, g.options().dtype(torch::kDouble));
  for (int64_t off = 0; off < g.numel(); off += chunk)
    sq.add_(g.narrow(0, off, std::min(chunk, g.numel() - off)).square().sum());
  if (world > 1) comm_->all_reduce_sum(sq);
  const double norm = std::sqrt(sq.item<double>());
  if (!std::isfinite(norm)) {
    // A non-finite gradient would poison the weights and both moments: skip this update.
    spdlog::warn("trainer: gradient norm is {}; optimizer step skipped (weights unchanged)", norm);
    return norm;
  }
  double coef = 1.0;
  if (o.grad_clip > 0) coef = o.grad_clip / (norm + 1e-6);  // as torch.nn.utils.clip_grad_norm_
  ++adam_steps_;
  const double b1 = o.beta1, b2 = o.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(adam_steps_));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(adam_steps_));
  // AdamW with decoupled weight decay, the same arithmetic as torch.optim.AdamW (single-tensor),
  // in place and chunk by chunk: the elementwise ops give the same numbers on any slice, and
  // one chunk's seven passes run in cache with one small scratch buffer instead of full-size
  // temporaries. On one rank the compute-dtype weights are refreshed in the same pass.
  const bool refresh_here = world == 1 && !master_.is_same(weights_);
  torch::Tensor denom = torch::empty({std::min(chunk, shard_)}, master_.options());
  for (int64_t off = 0; off < shard_; off += chunk) {
    const int64_t len = std::min(chunk, shard_ - off);
    torch::Tensor gc = g.narrow(0, off, len), p = master_.narrow(0, off, len);
    torch::Tensor m = exp_avg_.narrow(0, off, len), v = exp_avg_sq_.narrow(0, off, len);
    torch::Tensor d = denom.narrow(0, 0, len);
    if (coef < 1.0) gc.mul_(coef);
    p.mul_(1.0 - lr * o.weight_decay);
    m.lerp_(gc, 1.0 - b1);
    v.mul_(b2).addcmul_(gc, gc, 1.0 - b2);
    at::sqrt_out(d, v).div_(std::sqrt(bc2)).add_(o.eps);
    p.addcdiv_(m, d, -lr / bc1);
    if (refresh_here) weights_.narrow(0, off, len).copy_(p);
  }
  if (!refresh_here) refresh_weights_from_master();
  return norm;
}

void FlatParameters::refresh_weights_from_master() {
  torch::NoGradGuard no_grad;
  if (comm_->world_size() == 1) {
    if (!master_.is_same(weights_)) weights_.copy_(master_);
    return;
  }
  const torch::Tensor mine = master_.to(weights_.scalar_type());
  comm_->all_gather(mine, weights_);
}

std::map<std::string, torch::Tensor> FlatParameters::state() const {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  std::map<std::string, torch::Tensor> out = {
      {"exp_avg", exp_avg_.to(torch::kCPU, false, true)},
      {"exp_avg_sq", exp_avg_sq_.to(torch::kCPU, false, true)},
      {"step", torch::tensor({static_cast<double>(adam_steps_)}, f64)},
      {"layout", torch::tensor({static_cast<double>(numel_), static_cast<double>(comm_->world_size()),
                                static_cast<double>(comm_->rank())},
                               f64)}};
  // fp32 on one rank: the master weights are the model weights, which a checkpoint stores anyway.
  if (!master_.is_same(weights_) || master_in_state_)
    out["master"] = master_.detach().to(torch::kCPU, torch::kFloat, false, true);
  return out;
}

void FlatParameters::load_state(const std::map<std::string, torch::Tensor>& state, const std::string& what) {
  torch::NoGradGuard no_grad;
  for (const char* key : {"exp_avg", "exp_avg_sq", "step", "layout"})
    SWARM_REQUIRE(state.count(key) != 0, ErrorKind::INVALID_ARGUMENT, what + " has no '" + key + "'");
  const bool own_master = !master_.is_same(weights_) || master_in_state_;
  SWARM_REQUIRE(!own_master || state.count("master") != 0, ErrorKind::INVALID_ARGUMENT,
                what + " has no 'master' weights (saved in fp32 on one rank, loaded otherwise?)");
  const torch::Tensor layout = state.at("layout").to(torch::kDouble);
  SWARM_REQUIRE(layout.numel() == 3 && static_cast<int64_t>(layout[0].item<double>()) == numel_ &&
                    static_cast<int>(layout[1].item<double>()) == comm_->world_size() &&
                    static_cast<int>(layout[2].item<double>()) == comm_->rank(),
                ErrorKind::INVALID_ARGUMENT,
                what + " was saved for another model or rank layout (parameters, world size, rank)");
  for (const char* key : {"exp_avg", "exp_avg_sq"})
    SWARM_REQUIRE(state.at(key).numel() == shard_, ErrorKind::INVALID_ARGUMENT,
                  what + " '" + key + "' has the wrong size");
  if (own_master) {
    SWARM_REQUIRE(state.at("master").numel() == shard_, ErrorKind::INVALID_ARGUMENT,
                  what + " 'master' has the wrong size");
    master_.copy_(state.at("master").reshape(-1));
  }
  exp_avg_.copy_(state.at("exp_avg").reshape(-1));
  exp_avg_sq_.copy_(state.at("exp_avg_sq").reshape(-1));
  adam_steps_ = static_cast<int64_t>(state.at("step").to(torch::kDouble).item<double>());
  refresh_weights_from_master();
}

FlatParameters::Memory FlatParameters::memory() const {
  const auto bytes = [](const torch::Tensor& t) {
    return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : int64_t{0};
  };
  const bool master_is_weights =
      master_.defined() && weights_.defined() && master_.data_ptr() == weights_.data_ptr();
  return {bytes(weights_), bytes(grad_), bytes(exp_avg_) + bytes(exp_avg_sq_),
          master_is_weights ? 0 : bytes(master_)};
}

}  // namespace swarm
