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

TrainingAttention parse_training_attention(const std::string& name) {
  if (name == "auto") return TrainingAttention::AUTO;
  if (name == "eager") return TrainingAttention::EAGER;
  if (name == "blockwise") return TrainingAttention::BLOCKWISE;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                   "training_attention must be auto, eager or blockwise, got " + name);
}

const char* training_attention_name(TrainingAttention a) {
  switch (a) {
    case TrainingAttention::AUTO:
      return "auto";
    case TrainingAttention::EAGER:
      return "eager";
    case TrainingAttention::BLOCKWISE:
      return "blockwise";
  }
  return "?";
}

}  // namespace swarm
