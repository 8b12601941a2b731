// Checkpoint files of the torch backend: the trained model as a Hugging Face directory, and
// the trainer's state (optimizer shards) beside it for an exact resume.
#pragma once

#include <filesystem>

#include "model/safetensors.hpp"

namespace swarm {

class DecoderModel;
class PolicyTrainer;

/// Writes a Hugging Face model directory into `dir`: `model`'s weights (safetensors, in its
/// compute dtype, sharded like save_pretrained above 2 GB), config.json copied from `source_dir`
/// with torch_dtype set to match, and generation_config.json plus the tokenizer files that
/// `source_dir` has. Our loader and Hugging Face tools read the result.
void save_hf_model(const std::filesystem::path& dir, const DecoderModel& model,
                   const std::filesystem::path& source_dir);

/// Writes `trainer`'s state into `dir`: optimizer-rank<R>-of-<N>.safetensors (master weights
/// shard unless they are the model weights themselves, AdamW moments, step) and
/// trainer_state.json (what it was saved with). Every rank writes its own shard.
void save_trainer_state(const std::filesystem::path& dir, const PolicyTrainer& trainer);
/// Restores what save_trainer_state wrote for this rank. INVALID_ARGUMENT when the files are
/// missing or were written for another model or world size.
void load_trainer_state(const std::filesystem::path& dir, PolicyTrainer& trainer);

}  // namespace swarm
