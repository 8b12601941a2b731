#include "trainer/trainer_options.hpp"

#include "common/error.hpp"

namespace swarm {

OffPolicyCorrection parse_off_policy_correction(const std::string& name) {
  if (name == "none") return OffPolicyCorrection::NONE;
  if (name == "tis") return OffPolicyCorrection::TIS;
  if (name == "decoupled") return OffPolicyCorrection::DECOUPLED;
  throw SwarmError(
      ErrorKind::INVALID_ARGUMENT,
      "off_policy_correction must be none, tis or decoupled (auto is resolved by the job), got " + name);
}

}  // namespace swarm
