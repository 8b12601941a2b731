#include "model/safetensors_torch.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

namespace swarm {

c10::ScalarType to_scalar_type(DType dtype) noexcept {
  switch (dtype) {
    case DType::BOOL:
      return torch::kBool;
    case DType::U8:
      return torch::kByte;
    case DType::I8:
      return torch::kChar;
    case DType::I16:
      return torch::kShort;
    case DType::I32:
      return torch::kInt;
    case DType::I64:
      return torch::kLong;
    case DType::F16:
      return torch::kHalf;
    case DType::BF16:
      return torch::kBFloat16;
    case DType::F32:
      return torch::kFloat;
    case DType::F64:
      return torch::kDouble;
  }
  return torch::kFloat;
}

torch::Tensor to_tensor(const TensorView& view, std::shared_ptr<const void> keep_alive) {
  const std::vector<int64_t> sizes(view.shape.begin(), view.shape.end());
  const auto options = torch::TensorOptions().dtype(to_scalar_type(view.dtype)).device(torch::kCPU);
  if (reinterpret_cast<uintptr_t>(view.data) % dtype_size(view.dtype) != 0) {
    torch::Tensor copy = torch::empty(sizes, options);
    if (view.nbytes) std::memcpy(copy.data_ptr(), view.data, view.nbytes);
    return copy;
  }
  // from_blob never writes through the pointer; the const_cast only satisfies its signature.
  void* data = const_cast<std::byte*>(view.data);
  return torch::from_blob(
      data, sizes, [keep = std::move(keep_alive)](void*) {}, options);
}

std::map<std::string, torch::Tensor> load_state_dict(const SafetensorsModel& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& name : model.names()) out.emplace(name, to_tensor(model.at(name), model.file_of(name)));
  for (const auto& [alias, target] : model.aliases()) out.emplace(alias, out.at(target));
  return out;
}

std::map<std::string, torch::Tensor> load_state_dict(const std::filesystem::path& path) {
  return load_state_dict(SafetensorsModel::open(path));
}

}  // namespace swarm
