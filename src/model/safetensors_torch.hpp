// libtorch view of safetensors data: tensors that alias the read-only file mapping.
// The only safetensors file that includes torch; built only into swarm_model_torch.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <torch/types.h>

#include "model/safetensors.hpp"

namespace swarm {

/// The torch dtype of a safetensors dtype (all of DType map; U8 -> kByte, BOOL -> kBool).
c10::ScalarType to_scalar_type(DType dtype) noexcept;

/// A CPU tensor over `view`'s bytes. Zero-copy when the data is aligned to the element size
/// (always true for files written by the reference writer or ours): the tensor's deleter owns
/// `keep_alive` (typically the SafetensorsFile), so the mapping outlives every tensor that
/// aliases it. The mapping is read-only: writing into such a tensor crashes, clone() first.
/// Unaligned data is copied into a fresh tensor instead.
torch::Tensor to_tensor(const TensorView& view, std::shared_ptr<const void> keep_alive);

/// Every tensor of a model (directory with model.safetensors or a sharded index, or a single
/// .safetensors file), zero-copy. Tied weights stored once appear under both names, sharing
/// storage, as in a transformers state_dict.
std::map<std::string, torch::Tensor> load_state_dict(const SafetensorsModel& model);
std::map<std::string, torch::Tensor> load_state_dict(const std::filesystem::path& path);

}  // namespace swarm
