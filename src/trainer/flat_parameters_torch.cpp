#include "trainer/flat_parameters_torch.hpp"

#include <algorithm>
#include <cmath>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/error.hpp"

namespace swarm {
namespace {

int64_t numel_of(const std::pair<std::string, torch::Tensor>& named) { return named.second.numel(); }
int64_t numel_of(int64_t n) { return n; }

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

// Each parameter's offset in a flat vector holding them in `order` (a permutation of their
// indices; empty: their own order).
template <typename List>
std::vector<int64_t> flat_offsets(const List& sizes_of, const std::vector<size_t>& order) {
  const size_t n = sizes_of.size();
  std::vector<size_t> seq = order;
  if (seq.empty())
    for (size_t i = 0; i < n; ++i) seq.push_back(i);
  std::vector<char> seen(n, 0);
  SWARM_REQUIRE(seq.size() == n, ErrorKind::INVALID_ARGUMENT,
                "the flat order does not list every parameter once");
  std::vector<int64_t> offsets(n, 0);
  int64_t at = 0;
  for (size_t i : seq) {
    SWARM_REQUIRE(i < n && seen[i] == 0, ErrorKind::INVALID_ARGUMENT,
                  "the flat order does not list every parameter once");
    seen[i] = 1;
    offsets[i] = at;
    at += numel_of(sizes_of[i]);
  }
  return offsets;
}

// The identity on a parameter whose backward gives the gradient to its FlatParameters
// (gradient_sinks): the leaf gets none, so nothing holds a parameter-sized gradient beyond what
// accumulate() keeps.
struct GradientSink : public torch::autograd::Function<GradientSink> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               FlatParameters* owner, int64_t index) {
    ctx->saved_data["owner"] = reinterpret_cast<int64_t>(owner);
    ctx->saved_data["index"] = index;
    return x;  // returned unmodified: autograd makes it a view with this node as its grad_fn
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* owner = reinterpret_cast<FlatParameters*>(ctx->saved_data["owner"].toInt());
    if (grads[0].defined())
      owner->accumulate(static_cast<size_t>(ctx->saved_data["index"].toInt()), grads[0]);
    return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

FlatParameters::FlatParameters(const std::vector<std::pair<std::string, torch::Tensor>>& initial,
                               torch::ScalarType compute, torch::Device device,
                               std::shared_ptr<Collectives> comm,
                               const std::vector<std::pair<std::string, torch::Tensor>>* master_init,
                               const ShardingOptions& sharding, std::vector<size_t> order)
    : comm_(std::move(comm)), order_(std::move(order)) {
  SWARM_CHECK(comm_ != nullptr, "FlatParameters needs collectives");
  SWARM_REQUIRE(sharding.zero_stage == 1 || sharding.zero_stage == 2, ErrorKind::INVALID_ARGUMENT,
                "zero_stage must be 1 or 2");
  SWARM_REQUIRE(sharding.bucket_elements >= 1, ErrorKind::INVALID_ARGUMENT,
                "the gradient bucket must be >= 1 element");
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : initial) {
    names_.push_back(name);
    shapes_.push_back(t.sizes().vec());
  }
  offsets_ = flat_offsets(initial, order_);
  bool identity = true;  // the parameters' own order: stored as none (state() writes no "order")
  for (size_t k = 0; k < order_.size(); ++k) identity = identity && order_[k] == k;
  if (identity) order_.clear();
  for (const auto& [name, t] : initial) numel_ += t.numel();
  const int64_t world = comm_->world_size();
  // One bucket on one rank and at stage 1 (each rank a contiguous shard); at stage 2 as many as
  // bucket_elements asks, evened out so that the padding stays below buckets × world.
  zero2_ = sharding.zero_stage == 2 && world > 1;
  buckets_ =
      zero2_ ? std::max<int64_t>(1, (numel_ + sharding.bucket_elements - 1) / sharding.bucket_elements) : 1;
  piece_ = std::max<int64_t>(1, (numel_ + buckets_ * world - 1) / (buckets_ * world));
  shard_ = buckets_ * piece_;
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  weights_ = torch::zeros({shard_ * world}, torch::TensorOptions().dtype(compute).device(device));
  // Copies a parameter list (these names and sizes, in order) into a flat buffer.
  const auto check = [&](const std::vector<std::pair<std::string, torch::Tensor>>& list) {
    SWARM_REQUIRE(list.size() == initial.size(), ErrorKind::INVALID_ARGUMENT,
                  "master weights have a different parameter list");
    for (size_t i = 0; i < list.size(); ++i)
      SWARM_REQUIRE(list[i].first == names_[i] && list[i].second.numel() == initial[i].second.numel(),
                    ErrorKind::INVALID_ARGUMENT,
                    "master weights parameter '" + list[i].first + "' does not match");
  };
  const auto fill = [&](torch::Tensor& flat, const std::vector<std::pair<std::string, torch::Tensor>>& list) {
    check(list);
    for (size_t i = 0; i < list.size(); ++i)
      flat.narrow(0, offsets_[i], list[i].second.numel()).copy_(list[i].second.reshape(-1));
  };
  // fp32 weights start from the fp32 masters when given (a bf16 model trained in fp32 must not
  // start from its rounded weights), else from the initial values.
  fill(weights_, compute == torch::kFloat && master_init != nullptr ? *master_init : initial);
  grad_ = torch::zeros({zero2_ ? shard_ : shard_ * world}, f32);
  if (zero2_) {
    bucket_ = torch::empty({piece_ * world}, f32);
    received_ = torch::empty({piece_}, f32);
    pending_.resize(names_.size());
  }

  if (world == 1 && compute == torch::kFloat) {
    master_ = weights_;  // the fp32 weights are their own master copy
  } else if (master_init != nullptr && compute != torch::kFloat) {  // fp32 weights hold the masters already
    // This rank's pieces only, parameter slice by parameter slice: no full fp32 temporary.
    check(*master_init);
    master_ = torch::zeros({shard_}, f32);
    for_each_owned([&](int64_t flat, int64_t at, int64_t len) {
      for (size_t i = 0; i < master_init->size(); ++i) {
        const torch::Tensor& t = (*master_init)[i].second;
        const int64_t lo = std::max(flat, offsets_[i]), hi = std::min(flat + len, offsets_[i] + t.numel());
        if (lo >= hi) continue;
        master_.narrow(0, at + lo - flat, hi - lo).copy_(t.reshape(-1).narrow(0, lo - offsets_[i], hi - lo));
      }
    });
  } else {
    master_ = torch::empty({shard_}, f32);
    for_each_owned([&](int64_t flat, int64_t at, int64_t len) {
      master_.narrow(0, at, len).copy_(weights_.narrow(0, flat, len));
    });
  }
  exp_avg_ = torch::zeros({shard_}, f32);
  exp_avg_sq_ = torch::zeros({shard_}, f32);
}

template <typename Fn>
void FlatParameters::for_each_owned(Fn&& fn) const {
  const int64_t world = comm_->world_size(), rank = comm_->rank();
  for (int64_t k = 0; k < buckets_; ++k) fn((k * world + rank) * piece_, k * piece_, piece_);
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

std::vector<torch::Tensor> FlatParameters::gradient_sinks(const std::vector<torch::Tensor>& leaves) {
  SWARM_CHECK(leaves.size() == names_.size(), "gradient_sinks: one tensor per parameter");
  std::vector<torch::Tensor> out;
  out.reserve(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i)
    out.push_back(GradientSink::apply(leaves[i], this, static_cast<int64_t>(i)));
  return out;
}

void FlatParameters::accumulate(size_t i, const torch::Tensor& grad) {
  torch::NoGradGuard no_grad;
  SWARM_CHECK(i < names_.size() && grad.numel() == view(i).numel(),
              "accumulate: a gradient of the wrong size");
  if (!zero2_) {
    add_in_chunks(grad_.narrow(0, offsets_[i], grad.numel()), grad);
    return;
  }
  const int64_t span = piece_ * comm_->world_size();
  if (!started_) {  // the micro-batch's first gradient: every bucket waits for its parameters
    started_ = true;
    next_bucket_ = buckets_ - 1;
    waiting_.assign(static_cast<size_t>(buckets_), 0);
    arrived_.assign(names_.size(), 0);
    for (size_t p = 0; p < names_.size(); ++p) {
      const int64_t n = view(p).numel();
      for (int64_t k = offsets_[p] / span; n > 0 && k <= (offsets_[p] + n - 1) / span; ++k)
        ++waiting_[static_cast<size_t>(k)];
    }
  }
  const int64_t first_bucket = offsets_[i] / span, last_bucket = (offsets_[i] + grad.numel() - 1) / span;
  if (arrived_[i] != 0) {  // a second gradient for it (autograd sums a parameter's uses first)
    SWARM_CHECK(last_bucket <= next_bucket_, "a parameter's gradient came after its bucket was reduced");
    pending_[i] = pending_[i] + grad;
    return;
  }
  arrived_[i] = 1;
  pending_[i] = grad;
  for (int64_t k = first_bucket; k <= last_bucket; ++k) --waiting_[static_cast<size_t>(k)];
  // Buckets go in a fixed order (last to first, the backward's order) whatever order the
  // gradients come in, so every rank issues the same collectives in the same order.
  while (next_bucket_ >= 0 && waiting_[static_cast<size_t>(next_bucket_)] == 0) send_bucket(next_bucket_--);
}

// Bucket k's gradients (0 for a parameter that has none) summed over ranks into this rank's
// piece of the shard; the parameters that end in it are done with.
void FlatParameters::send_bucket(int64_t k) {
  const int64_t span = piece_ * comm_->world_size();
  const int64_t lo = k * span, hi = std::min(lo + span, numel_);
  bucket_.zero_();
  for (size_t i = 0; i < names_.size(); ++i) {
    if (!pending_[i].defined()) continue;
    const int64_t n = pending_[i].numel();
    const int64_t a = std::max(lo, offsets_[i]), b = std::min(hi, offsets_[i] + n);
    if (a >= b) continue;
    bucket_.narrow(0, a - lo, b - a).copy_(pending_[i].reshape(-1).narrow(0, a - offsets_[i], b - a));
    if (offsets_[i] >= lo) pending_[i] = torch::Tensor();
  }
  comm_->reduce_scatter_sum(bucket_, received_);
  grad_.narrow(0, k * piece_, piece_).add_(received_);
}

void FlatParameters::finish_micro_batch() {
  if (!zero2_) return;
  torch::NoGradGuard no_grad;
  if (!started_) next_bucket_ = buckets_ - 1;  // no gradient at all: every bucket goes as zeros
  while (next_bucket_ >= 0) send_bucket(next_bucket_--);
  for (auto& t : pending_) t = torch::Tensor();
  started_ = false;
}

void FlatParameters::zero_gradients() {
  grad_.zero_();
  // A micro-batch a failure cut short leaves nothing behind for the next step.
  for (auto& t : pending_) t = torch::Tensor();
  started_ = false;
}

torch::Tensor FlatParameters::gradient(size_t i) const {
  SWARM_REQUIRE(!zero2_, ErrorKind::CONFLICT,
                "parameter gradients are sharded over the ranks (zero_stage 2): no rank holds one whole");
  int64_t n = 1;
  for (int64_t d : shapes_[i]) n *= d;
  return grad_.narrow(0, offsets_[i], n).view(shapes_[i]);
}

double FlatParameters::step(double lr, const AdamWOptions& o) {
  torch::NoGradGuard no_grad;
  const int world = comm_->world_size();
  SWARM_CHECK(!started_, "optimizer step inside a micro-batch (finish_micro_batch not called)");
  torch::Tensor g = grad_;     // stage 2 on several ranks: the shard, summed over ranks already
  if (world > 1 && !zero2_) {  // stage 1: one bucket, the whole buffer
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
  const int64_t span = piece_ * comm_->world_size();
  for (int64_t k = 0; k < buckets_; ++k) {
    const torch::Tensor mine = master_.narrow(0, k * piece_, piece_).to(weights_.scalar_type());
    torch::Tensor full = weights_.narrow(0, k * span, span);
    comm_->all_gather(mine, full);
  }
}

std::map<std::string, torch::Tensor> FlatParameters::state() const {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  std::map<std::string, torch::Tensor> out = {
      {"exp_avg", exp_avg_.to(torch::kCPU, false, true)},
      {"exp_avg_sq", exp_avg_sq_.to(torch::kCPU, false, true)},
      {"step", torch::tensor({static_cast<double>(adam_steps_)}, f64)},
      {"layout", torch::tensor({static_cast<double>(numel_), static_cast<double>(comm_->world_size()),
                                static_cast<double>(comm_->rank()), static_cast<double>(piece_)},
                               f64)}};
  if (!order_.empty()) {
    std::vector<double> order(order_.begin(), order_.end());
    out["order"] = torch::tensor(order, f64);
  }
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
  const int64_t world = comm_->world_size();
  const torch::Tensor layout = state.at("layout").to(torch::kDouble);
  SWARM_REQUIRE((layout.numel() == 3 || layout.numel() == 4) &&
                    static_cast<int64_t>(layout[0].item<double>()) == numel_ &&
                    static_cast<int>(layout[1].item<double>()) == world &&
                    static_cast<int>(layout[2].item<double>()) == comm_->rank(),
                ErrorKind::INVALID_ARGUMENT,
                what + " was saved for another model or rank layout (parameters, world size, rank)");
  // Three numbers: saved before gradient buckets, one contiguous shard per rank.
  const int64_t saved_shard = state.at("exp_avg").numel();
  const int64_t saved_piece = layout.numel() == 4 ? static_cast<int64_t>(layout[3].item<double>())
                                                  : std::max<int64_t>(saved_shard, 1);
  SWARM_REQUIRE(saved_piece >= 1 && saved_shard % saved_piece == 0 && saved_shard * world >= numel_,
                ErrorKind::INVALID_ARGUMENT, what + " has a layout that does not fit its shard");
  std::vector<size_t> saved_order;
  if (state.count("order") != 0) {
    const torch::Tensor o = state.at("order").to(torch::kDouble).reshape(-1);
    for (int64_t i = 0; i < o.numel(); ++i) saved_order.push_back(static_cast<size_t>(o[i].item<double>()));
  }
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < names_.size(); ++i) sizes.push_back(view(i).numel());
  const std::vector<int64_t> saved_offsets = flat_offsets(sizes, saved_order);  // validates the permutation
  const bool same_layout = saved_piece == piece_ && saved_shard == shard_ && saved_offsets == offsets_;
  for (const char* key : {"exp_avg", "exp_avg_sq", "master"})
    if (state.count(key) != 0)
      SWARM_REQUIRE(state.at(key).numel() == saved_shard, ErrorKind::INVALID_ARGUMENT,
                    what + " '" + key + "' has the wrong size");
  if (!same_layout)
    spdlog::info("trainer: {} was saved in {}-element pieces{}; re-cut into this run's {}-element pieces",
                 what, saved_piece, saved_order == order_ ? "" : " and another parameter order", piece_);
  // Puts a saved shard into `dst` ([shard_]): as it is, or through the whole vector.
  const auto place = [&](const torch::Tensor& saved, torch::Tensor& dst) {
    const torch::Tensor local = saved.reshape(-1).to(dst.device(), torch::kFloat).contiguous();
    if (same_layout) {
      dst.copy_(local);
      return;
    }
    torch::Tensor gathered = torch::empty({saved_shard * world}, local.options());
    if (world > 1) {
      comm_->all_gather(local, gathered);
    } else {
      gathered.copy_(local);
    }
    const torch::Tensor saved_flat = shards_in_flat_order(gathered.chunk(world), saved_piece);
    torch::Tensor flat = torch::zeros({shard_ * world}, local.options());
    for (size_t i = 0; i < sizes.size(); ++i)
      flat.narrow(0, offsets_[i], sizes[i]).copy_(saved_flat.narrow(0, saved_offsets[i], sizes[i]));
    for_each_owned(
        [&](int64_t f, int64_t at, int64_t len) { dst.narrow(0, at, len).copy_(flat.narrow(0, f, len)); });
  };
  if (own_master) place(state.at("master"), master_);
  place(state.at("exp_avg"), exp_avg_);
  place(state.at("exp_avg_sq"), exp_avg_sq_);
  adam_steps_ = static_cast<int64_t>(state.at("step").to(torch::kDouble).item<double>());
  refresh_weights_from_master();
}

FlatParameters::Memory FlatParameters::memory() const {
  const auto bytes = [](const torch::Tensor& t) {
    return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : int64_t{0};
  };
  const bool master_is_weights =
      master_.defined() && weights_.defined() && master_.data_ptr() == weights_.data_ptr();
  return {bytes(weights_), bytes(grad_) + bytes(bucket_) + bytes(received_),
          bytes(exp_avg_) + bytes(exp_avg_sq_), master_is_weights ? 0 : bytes(master_)};
}

torch::Tensor shards_in_flat_order(const std::vector<torch::Tensor>& shards, int64_t piece) {
  SWARM_REQUIRE(!shards.empty() && piece >= 1, ErrorKind::INVALID_ARGUMENT,
                "shards_in_flat_order: no shards");
  const int64_t shard = shards[0].numel();
  SWARM_REQUIRE(shard % piece == 0, ErrorKind::INVALID_ARGUMENT,
                "shards_in_flat_order: a shard is not a whole number of pieces");
  std::vector<torch::Tensor> parts;
  for (int64_t k = 0; k < shard / piece; ++k)
    for (const torch::Tensor& s : shards) {
      SWARM_REQUIRE(s.numel() == shard, ErrorKind::INVALID_ARGUMENT,
                    "shards_in_flat_order: shards differ in size");
      parts.push_back(s.reshape(-1).narrow(0, k * piece, piece));
    }
  return torch::cat(parts);
}

}  // namespace swarm
