// How the training forward pass computes (DecoderModel::final_hidden for the trainer): which
// attention, and whether each decoder layer is recomputed in the backward instead of keeping its
// activations. No torch: the trainer's options carry it (trainer_options.hpp).
#pragma once

#include <cstdint>
#include <string>

namespace swarm {

/// The attention of a training forward (job key training_attention).
enum class TrainingAttention {
  AUTO,       // scaled_dot_product_attention on a GPU with libtorch 2.x (windowed layers: blockwise),
              // blockwise elsewhere
  EAGER,      // the plain formula: [rows, heads, T, T] fp32 scores and probabilities (O(T²) memory)
  BLOCKWISE,  // kernels/cpu/blockwise_attention_torch.hpp on every device: O(T · block) memory
};
/// "auto", "eager", "blockwise"; INVALID_ARGUMENT naming them otherwise.
TrainingAttention parse_training_attention(const std::string& name);
const char* training_attention_name(TrainingAttention a);

struct TrainingForward {
  TrainingAttention attention = TrainingAttention::AUTO;
  /// Activation checkpointing: each decoder layer keeps only its input and recomputes its
  /// activations in the backward (job key gradient_checkpointing).
  bool checkpoint_layers = false;
  /// The blockwise kernel's query/key block in tokens; 0 = kAttentionBlock (tests use small ones).
  int64_t attention_block = 0;
};

}  // namespace swarm
