// libFuzzer target: a job config as sync_train_config receives it (YAML text, our flat keys or
// AgentJet's `ajet:` tree) through the same parser and validator. Bad input must be a
// ConfigError naming the problem (the engine turns it into a 400), never another exception
// or a crash; a config that is
// accepted must survive its own round trip (to_yaml, then parsed again to the same YAML).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/error.hpp"
#include "swarm/errors.hpp"
#include "swarm/job.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  swarm::Job job;
  try {
    job = swarm::Job::from_yaml(yaml);
  } catch (const swarm::ConfigError& e) {
    if (std::string(e.what()).empty()) std::abort();  // every refusal says why
    return 0;
  } catch (...) {
    std::abort();  // yaml-cpp or nlohmann exceptions must not escape the parser
  }
  const std::string again = job.to_yaml();
  try {
    if (swarm::Job::from_yaml(again).to_yaml() != again) std::abort();
  } catch (...) {
    std::abort();  // what the server accepted and wrote back must read back
  }
  return 0;
}
