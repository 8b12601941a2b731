#include "dist/collectives_torch.hpp"
#include "common/env.hpp"
#include "dist/key_value_store.hpp"
#include "dist/rank_channel.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/version.h>
#ifdef SWARM_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>
#include <optional>
#include <utility>
#include <vector>

#include "common/error.hpp"

namespace swarm {
namespace {

// ---------------------------------------------------------------- argument checks (all backends)

void require_contiguous(const char* op, const at::Tensor& t) {
  SWARM_REQUIRE(t.defined() && t.is_contiguous(), ErrorKind::INVALID_ARGUMENT,
                std::string("collective ") + op + ": tensors must be defined and contiguous");
}

void require_shard_of(const char* op, const at::Tensor& full, const at::Tensor& shard, int world_size) {
  require_contiguous(op, full);
  require_contiguous(op, shard);
  SWARM_REQUIRE(full.scalar_type() == shard.scalar_type() && full.device() == shard.device(),
                ErrorKind::INVALID_ARGUMENT,
                std::string("collective ") + op + ": full and shard differ in dtype or device");
  SWARM_REQUIRE(full.numel() == world_size * shard.numel(), ErrorKind::INVALID_ARGUMENT,
                std::string("collective ") + op + ": full has " + std::to_string(full.numel()) +
                    " elements, expected world_size " + std::to_string(world_size) + " x shard " +
                    std::to_string(shard.numel()));
}

void require_root(int root, int world_size) {
  SWARM_REQUIRE(root >= 0 && root < world_size, ErrorKind::INVALID_ARGUMENT,
                "collective broadcast: root " + std::to_string(root) + " is not a rank of " +
                    std::to_string(world_size));
}

// ---------------------------------------------------------------- single process

class SingleProcessCollectives final : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend_name() const override { return "single"; }

  void all_reduce_sum(torch::Tensor& t) override { require_contiguous("all_reduce", t); }

  void reduce_scatter_sum(const torch::Tensor& full, torch::Tensor& shard) override {
    require_shard_of("reduce_scatter", full, shard, 1);
    shard.view(-1).copy_(full.view(-1));
  }

  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override {
    require_shard_of("all_gather", full, shard, 1);
    full.view(-1).copy_(shard.view(-1));
  }

  void broadcast(torch::Tensor& t, int root) override {
    require_contiguous("broadcast", t);
    require_root(root, 1);
  }

  void barrier() override {}
};

// ---------------------------------------------------------------- c10d

// The process-group base class: ProcessGroup in libtorch 1.x, Backend since 2.0 (where a
// ProcessGroup dispatches to Backends). The collective signatures used here exist in both.
#if TORCH_VERSION_MAJOR >= 2
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif

std::string describe(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string string_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

/// The rendezvous store c10d's collectives meet through (key_value_store.hpp): rank 0 hosts it
/// in-process and reads it directly; every other rank joins it with the job's secret. One
/// request at a time per object; clone() gives another connection.
class AuthenticatedStore final : public c10d::Store {
 public:
  /// Rank 0: hosts the store on host:port.
  AuthenticatedStore(const DistConfig& config, std::chrono::milliseconds timeout)
      : c10d::Store(timeout), config_(config) {
    if (config.rank == 0) {
      local_ = std::make_shared<KeyValueStore>();
      server_ = std::make_shared<KeyValueServer>(local_, config.master_addr, config.master_port,
                                                 config.world_size, config.secret);
    } else {
      remote_ = std::make_unique<KeyValueClient>(config.master_addr, config.master_port, config.rank, timeout,
                                                 config.secret);
    }
  }

  // Another handle on the same store (libtorch 2.x asks for one; it overrides Store::clone
  // there and is a plain method on 1.13, which has none).
  c10::intrusive_ptr<c10d::Store> clone() {
    if (local_) return c10::make_intrusive<AuthenticatedStore>(*this, local_, server_);
    return c10::make_intrusive<AuthenticatedStore>(config_, timeout_);
  }
  AuthenticatedStore(const AuthenticatedStore& other, std::shared_ptr<KeyValueStore> local,
                     std::shared_ptr<KeyValueServer> server)
      : c10d::Store(other.timeout_),
        config_(other.config_),
        local_(std::move(local)),
        server_(std::move(server)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard lk(mu_);
    if (local_) return local_->set(key, string_of(value));
    remote_->set(key, string_of(value));
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    std::lock_guard lk(mu_);
    return bytes_of(local_ ? local_->compare_set(key, string_of(expected), string_of(desired))
                           : remote_->compare_set(key, string_of(expected), string_of(desired)));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    std::lock_guard lk(mu_);
    std::optional<std::string> v = local_ ? local_->get(key, timeout_) : remote_->get(key, timeout_);
    TORCH_CHECK(v.has_value(), "rendezvous store: key '", key, "' did not appear within ", timeout_.count(),
                " ms");
    return bytes_of(*v);
  }
  int64_t add(const std::string& key, int64_t value) override {
    std::lock_guard lk(mu_);
    return local_ ? local_->add(key, value) : remote_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    std::lock_guard lk(mu_);
    return local_ ? local_->erase(key) : remote_->erase(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard lk(mu_);
    return local_ ? local_->check(keys) : remote_->check(keys);
  }
  int64_t getNumKeys() override {
    std::lock_guard lk(mu_);
    return local_ ? local_->size() : remote_->size();
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::lock_guard lk(mu_);
    const bool ok = local_ ? local_->wait(keys, timeout) : remote_->wait(keys, timeout);
    TORCH_CHECK(ok, "rendezvous store: ", keys.size(), " key(s) did not appear within ", timeout.count(),
                " ms");
  }

 private:
  const DistConfig config_;
  std::mutex mu_;
  std::shared_ptr<KeyValueStore> local_;    // rank 0
  std::shared_ptr<KeyValueServer> server_;  // rank 0: serves the others while any handle lives
  std::unique_ptr<KeyValueClient> remote_;  // the other ranks
};

/// Gloo or NCCL behind one rendezvous store. Gloo (libtorch 1.13) lacks reduce_scatter and bf16
/// arithmetic; both are emulated below (see reduce_scatter_sum / sum_buffer).
class C10dCollectives final : public Collectives {
 public:
  C10dCollectives(const DistConfig& config, bool nccl, c10::intrusive_ptr<c10d::Store> store,
                  c10::intrusive_ptr<C10dGroup> group)
      : rank_(config.rank),
        world_size_(config.world_size),
        timeout_(config.timeout),
        nccl_(nccl),
        store_(std::move(store)),
        group_(std::move(group)) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return nccl_ ? "nccl" : "gloo"; }

  void all_reduce_sum(torch::Tensor& t) override {
    require_tensor("all_reduce", t);
    std::vector<at::Tensor> tensors{sum_buffer(t)};
    run("all_reduce", [&] { return group_->allreduce(tensors); });
    if (!tensors[0].is_same(t)) t.copy_(tensors[0]);
  }

  void reduce_scatter_sum(const torch::Tensor& full, torch::Tensor& shard) override {
    require_shard_of("reduce_scatter", full, shard, world_size_);
    require_tensor("reduce_scatter", full);
    const int64_t n = shard.numel();
    if (nccl_) {
      at::Tensor in = full.view(-1), out = shard.view(-1);
      run("reduce_scatter", [&] { return group_->_reduce_scatter_base(out, in); });
      return;
    }
    // Gloo has no reduce_scatter: all-reduce a copy of `full` and keep this rank's slice.
    // Correct, at twice the traffic of a real reduce-scatter.
    std::vector<at::Tensor> tensors{sum_buffer(full).clone().view(-1)};
    run("reduce_scatter", [&] { return group_->allreduce(tensors); });
    shard.view(-1).copy_(tensors[0].narrow(0, rank_ * n, n));
  }

  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override {
    require_shard_of("all_gather", full, shard, world_size_);
    require_tensor("all_gather", full);
    const int64_t n = shard.numel();
    at::Tensor in = byte_view(shard).view(-1), out = byte_view(full).view(-1);
    if (nccl_) {
      run("all_gather", [&] { return group_->_allgather_base(out, in); });
      return;
    }
    // Gloo's _allgather_base is missing in 1.13; allgather fills one output per rank, and
    // those are views into `full`.
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_size_; ++r) outputs[0].push_back(out.narrow(0, r * n, n));
    std::vector<at::Tensor> inputs{in};
    run("all_gather", [&] { return group_->allgather(outputs, inputs); });
  }

  void broadcast(torch::Tensor& t, int root) override {
    require_tensor("broadcast", t);
    require_root(root, world_size_);
    std::vector<at::Tensor> tensors{byte_view(t)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    run("broadcast", [&] { return group_->broadcast(tensors, options); });
  }

  void barrier() override {
    run("barrier", [&] { return group_->barrier(); });
  }

 private:
  void require_tensor(const char* op, const at::Tensor& t) const {
    require_contiguous(op, t);
    SWARM_REQUIRE(t.is_cuda() == nccl_, ErrorKind::INVALID_ARGUMENT,
                  std::string("collective ") + op + ": backend " + backend_name() + " needs " +
                      (nccl_ ? "CUDA" : "CPU") + " tensors");
  }

  // Gloo cannot sum bf16 (libtorch 1.13): sum an fp32 copy, rounded once when copied back.
  at::Tensor sum_buffer(const at::Tensor& t) const {
    return !nccl_ && t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t;
  }

  // Gloo cannot move bf16 either, but broadcast and all_gather only move bytes: reinterpret
  // bf16 as fp16 (same width), which Gloo copies bit for bit.
  at::Tensor byte_view(const at::Tensor& t) const {
    return !nccl_ && t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
  }

  // Issues one collective and waits for it, turning every failure into UNAVAILABLE. After a
  // failure the group's state is unknown (a peer may be gone), so later calls fail at once.
  template <class Issue>
  void run(const char* op, Issue&& issue) {
    const std::string where = " on rank " + std::to_string(rank_) + " of " + std::to_string(world_size_);
    SWARM_REQUIRE(
        broken_.empty(), ErrorKind::UNAVAILABLE,
        std::string("collective ") + op + where + " refused: an earlier collective failed: " + broken_);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = issue();
      work->wait(timeout_);  // throws the failure, or "Operation timed out!" past timeout_
    } catch (const std::exception& e) {
      broken_ = work && !work->isCompleted() ? "no result after " + std::to_string(timeout_.count()) +
                                                   " ms (a peer is missing or stuck)"
                                             : describe(e);
      throw SwarmError(ErrorKind::UNAVAILABLE,
                       std::string("collective ") + op + where + " failed: " + broken_);
    }
  }

  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds timeout_;
  const bool nccl_;
  std::string broken_;                     // why the group is unusable; empty while healthy
  c10::intrusive_ptr<c10d::Store> store_;  // declared before group_: outlives it
  c10::intrusive_ptr<C10dGroup> group_;
};

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

// The network device Gloo binds to: the interface named by GLOO_SOCKET_IFNAME (as PyTorch
// does), loopback for a single-host job, otherwise the address this host's name resolves to.
std::shared_ptr<gloo::transport::Device> gloo_device(const std::string& master_addr) {
  if (const auto ifname = env_value("GLOO_SOCKET_IFNAME"))
    return c10d::ProcessGroupGloo::createDeviceForInterface(*ifname);
  if (is_loopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

namespace {

torch::Tensor values_on(const std::vector<double>& values, const torch::Device& device) {
  return torch::tensor(values, torch::TensorOptions().dtype(torch::kDouble)).to(device);
}

std::vector<double> values_of(const torch::Tensor& t) {
  const torch::Tensor host = t.to(torch::kCPU).contiguous();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

}  // namespace

std::vector<double> all_reduce_sum_values(Collectives& comm, const std::vector<double>& values,
                                          const torch::Device& device) {
  if (comm.world_size() == 1 || values.empty()) return values;
  torch::Tensor t = values_on(values, device);
  comm.all_reduce_sum(t);
  return values_of(t);
}

std::vector<double> all_gather_values(Collectives& comm, const std::vector<double>& values,
                                      const torch::Device& device) {
  if (comm.world_size() == 1 || values.empty()) return values;
  const torch::Tensor mine = values_on(values, device);
  torch::Tensor all = torch::empty({comm.world_size() * mine.numel()}, mine.options());
  comm.all_gather(mine, all);
  return values_of(all);
}

std::unique_ptr<Collectives> make_single_process_collectives() {
  return std::make_unique<SingleProcessCollectives>();
}

std::unique_ptr<Collectives> make_collectives(const DistConfig& config, bool cuda) {
  SWARM_REQUIRE(
      config.world_size >= 1 && config.rank >= 0 && config.rank < config.world_size,
      ErrorKind::INVALID_ARGUMENT,
      "rank " + std::to_string(config.rank) + " is not in a world of " + std::to_string(config.world_size));
  SWARM_REQUIRE(config.master_port >= 1 && config.master_port <= 65535, ErrorKind::INVALID_ARGUMENT,
                "master_port " + std::to_string(config.master_port) + " is not a TCP port");
  SWARM_REQUIRE(config.timeout.count() > 0, ErrorKind::INVALID_ARGUMENT,
                "the collectives timeout must be positive");
  if (config.world_size == 1) return make_single_process_collectives();
#ifndef SWARM_WITH_CUDA
  SWARM_REQUIRE(!cuda, ErrorKind::INVALID_ARGUMENT,
                "NCCL collectives need a build with SWARM_WITH_CUDA=ON; this build is CPU-only");
#endif

  const std::string endpoint = config.master_addr + ":" + std::to_string(config.master_port);
  try {
    // Only the job's ranks get in (key_value_store.hpp), and its keys live under a name only
    // they can derive besides (rank_channel.hpp).
    auto authenticated = c10::make_intrusive<AuthenticatedStore>(config, config.timeout);
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>(
        store_namespace(config.secret, config.master_port), authenticated);
    c10::intrusive_ptr<C10dGroup> group;
#ifdef SWARM_WITH_CUDA
    if (cuda) {
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = config.timeout;
      group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, config.rank, config.world_size, options);
    }
#endif
    if (!cuda) {
      auto options = c10d::ProcessGroupGloo::Options::create(config.timeout);
      options->devices.push_back(gloo_device(config.master_addr));
      group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, config.rank, config.world_size, options);
    }
    return std::make_unique<C10dCollectives>(config, cuda, std::move(store), std::move(group));
  } catch (const std::exception& e) {
    throw SwarmError(ErrorKind::UNAVAILABLE, "rendezvous at " + endpoint + " failed on rank " +
                                                 std::to_string(config.rank) + " of " +
                                                 std::to_string(config.world_size) + ": " + describe(e));
  }
}

}  // namespace swarm
