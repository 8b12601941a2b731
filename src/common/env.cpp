#include "common/env.hpp"

#include <cstdlib>
#include <stdexcept>

namespace swarm {
namespace {

constexpr EnvVar kEnvVars[] = {
    {"SWARM_ADMIN_TOKEN", "swarm-server, libswarm_client",
     "Bearer token of the admin routes (sync, start, stop, ...) when no `--admin-token-file` is given; "
     "the SDK sends it on admin calls."},
    {"SWARM_CLIENT_TOKEN", "swarm-server, libswarm_client",
     "Bearer token of the agent routes (episodes, the model APIs) when no `--client-token-file` is given; "
     "the SDK sends it on every call."},
    {"SWARM_CA_FILE", "libswarm_client, swarm-overwatch (every HTTP client)",
     "PEM file of the certificate authorities an `https://` server is checked against (default: the "
     "system's)."},
    {"WORLD_SIZE", "swarm-server", "Ranks in a multi-process job (torchrun's name); unset = 1."},
    {"RANK", "swarm-server", "This process's rank in [0, WORLD_SIZE); rank 0 serves HTTP."},
    {"LOCAL_WORLD_SIZE", "swarm-server", "Ranks on this machine (default WORLD_SIZE)."},
    {"LOCAL_RANK", "swarm-server",
     "This rank's index on its machine, in [0, LOCAL_WORLD_SIZE): its GPU (default RANK modulo "
     "LOCAL_WORLD_SIZE)."},
    {"MASTER_ADDR", "swarm-server", "Address of rank 0's control channel (default 127.0.0.1)."},
    {"MASTER_PORT", "swarm-server", "Port of rank 0's control channel (default 29500)."},
    {"SWARM_RENDEZVOUS_SECRET", "swarm-server",
     "The job's rendezvous secret, which every rank proves when it joins (--rendezvous-secret-file); "
     "required "
     "when ranks run on several machines."},
    {"SWARM_DIST_TIMEOUT_SECONDS", "swarm-server",
     "How long a rank waits for the others (rendezvous, a collective) before it fails the job."},
    {"GLOO_SOCKET_IFNAME", "swarm-server",
     "Network interface Gloo's collectives bind (default: loopback for a single-host job, else the "
     "address this host's name resolves to)."},
    {"SWARM_CPU_LEVEL", "swarm-server, benchmarks",
     "Caps the CPU kernels' instruction set: `base`, `avx2` or `avx512` (only ever lowers; for tests and "
     "measurements)."},
    {"SWARM_GEMM_SPLIT", "swarm-server",
     "`0`: no split GEMMs on the shared thread pool (the older plan; for "
     "measuring); unset or `1`: split."},
    {"SWARM_WIDEN_PANEL_KB", "swarm-server",
     "Bytes (KiB) of one thread's fp32 weight panel in the widening bf16 linear (default 384; for "
     "measuring)."},
    {"GOMP_SPINCOUNT", "swarm-server",
     "libgomp's spin before a worker sleeps. When neither this nor OMP_WAIT_POLICY is set, the torch "
     "build re-executes itself once with a bounded spin (src/common/openmp_wait.hpp)."},
    {"OMP_WAIT_POLICY", "swarm-server", "libgomp's wait policy; when set, swarm leaves the spin alone."},
    {"NO_COLOR", "swarm-overwatch", "Any value: no colours (as `--no-color`)."},
    {"SWARM_TEST_KILL_DURING_CHECKPOINT", "swarm-server (tests)",
     "Chaos tests only: a step number; the process SIGKILLs itself while writing that step's checkpoint "
     "(after the weights, before anything is renamed into place)."},
};

}  // namespace

std::span<const EnvVar> env_vars() { return kEnvVars; }

std::optional<std::string> env_value(std::string_view name) {
  bool known = false;
  for (const EnvVar& v : kEnvVars) known = known || v.name == name;
  if (!known) throw std::logic_error("environment variable " + std::string(name) + " is not in env_vars()");
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::string env_reference_markdown() {
  std::string out = "| variable | read by | meaning |\n|---|---|---|\n";
  for (const EnvVar& v : kEnvVars) {
    out += "| `" + std::string(v.name) + "` | " + std::string(v.read_by) + " | " + std::string(v.meaning) +
           " |\n";
  }
  return out;
}

}  // namespace swarm
