// safetensors: reader (mmap, strict validation), sharded models (model.safetensors.index.json),
// writer (atomic, sharded above a size limit) and dtype helpers. No torch here; the libtorch
// adapter is safetensors_torch.hpp.
//
// File format: 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, NAME: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
// padded with spaces, then the data section; offsets are relative to the data section, which
// the tensors cover exactly, without holes or overlaps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace swarm {

struct ModelConfig;

// ---------------------------------------------------------------- dtypes

/// Element types swarm reads and writes (safetensors names: "F32", "BF16", ...).
enum class DType : uint8_t { BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64 };

size_t dtype_size(DType dtype) noexcept;
/// The safetensors name, e.g. "BF16".
const char* dtype_name(DType dtype) noexcept;
/// Parses a safetensors dtype name; nullopt for unknown or unsupported ones (F8_*, U16, ...).
std::optional<DType> dtype_from_name(std::string_view name) noexcept;
bool dtype_is_floating(DType dtype) noexcept;

/// f32 -> bf16 with round-to-nearest-even (NaN stays NaN).
uint16_t f32_to_bf16(float value) noexcept;
float bf16_to_f32(uint16_t bits) noexcept;
/// f32 -> IEEE half with round-to-nearest-even (overflow -> inf, NaN stays NaN).
uint16_t f32_to_f16(float value) noexcept;
float f16_to_f32(uint16_t bits) noexcept;

// ---------------------------------------------------------------- reading

/// One tensor inside a mapped file. `data` points into the mapping and lives as long as the
/// SafetensorsFile that produced it; it is not necessarily aligned to the element size.
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const noexcept;
  /// The elements converted to float (any dtype; integers are cast).
  std::vector<float> to_f32() const;
};

/// The parsed JSON header of a safetensors file.
struct SafetensorsHeader {
  struct Entry {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    uint64_t begin = 0;  // offsets relative to the data section
    uint64_t end = 0;
  };
  uint64_t header_size = 0;    // N
  std::vector<Entry> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;

  /// Where the data section starts in the file (8 + N).
  uint64_t data_offset() const noexcept { return 8 + header_size; }
};

/// Largest JSON header accepted (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

/// Parses and validates the header of a safetensors file of `file_size` bytes whose first
/// bytes are `bytes` (at least 8 + N of them, or the whole file). Checks: N fits in the file,
/// the JSON is an object starting with '{', every entry has a known dtype, a shape of
/// non-negative dims and offsets with end - begin == numel * dtype size, and the tensors cover
/// the data section exactly with no overlap or hole. Throws SwarmError(INVALID_ARGUMENT) whose
/// message starts with `source` and names the tensor at fault. Never reads past `bytes`.
SafetensorsHeader parse_safetensors_header(std::span<const std::byte> bytes, uint64_t file_size,
                                           std::string_view source);

/// A memory-mapped (read-only) safetensors file. Immutable after open(), so it may be shared
/// between threads freely; the views and their data live as long as the object.
class SafetensorsFile {
  struct Private {};

 public:
  /// Maps and validates `path`. Errors name the file (and tensor).
  static std::shared_ptr<const SafetensorsFile> open(const std::filesystem::path& path);

  SafetensorsFile(Private, std::filesystem::path path, const std::byte* map, size_t size);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }
  /// All tensors, sorted by name.
  const std::vector<TensorView>& tensors() const noexcept { return tensors_; }
  const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  /// nullptr when absent.
  const TensorView* find(std::string_view name) const noexcept;
  /// Throws SwarmError(INVALID_ARGUMENT) "FILE: missing tensor 'NAME'" when absent.
  const TensorView& at(std::string_view name) const;
  /// The whole mapping (header included).
  std::span<const std::byte> bytes() const noexcept { return {map_, size_}; }

 private:
  std::filesystem::path path_;
  const std::byte* map_;
  size_t size_;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// A Hugging Face model's weights: model.safetensors, or the shards that
/// model.safetensors.index.json lists, each opened (mapped) once. Tensor names are unique
/// across shards. Tied weights saved under one name (the safetensors convention of recording
/// {"removed name": "kept name"} in __metadata__) are found under both names.
/// Immutable after open(); safe to share between threads.
class SafetensorsModel {
 public:
  /// `path` is a model directory or a single .safetensors file.
  static SafetensorsModel open(const std::filesystem::path& path);

  const std::filesystem::path& path() const noexcept { return path_; }
  /// nullptr when absent (aliases of tied weights are resolved).
  const TensorView* find(std::string_view name) const noexcept;
  /// Throws SwarmError(INVALID_ARGUMENT) naming the model and tensor when absent.
  const TensorView& at(std::string_view name) const;
  /// The file holding `name` (keeps the mapping alive); nullptr when absent.
  std::shared_ptr<const SafetensorsFile> file_of(std::string_view name) const noexcept;
  /// Names of the stored tensors, sorted (aliases not included).
  std::vector<std::string> names() const;
  /// Alias name -> stored name (tied weights).
  const std::map<std::string, std::string, std::less<>>& aliases() const noexcept { return aliases_; }
  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const noexcept { return files_; }
  size_t size() const noexcept { return tensors_.size(); }
  /// Sum of the files' sizes on disk.
  uint64_t file_bytes() const noexcept;

  /// Every mismatch between the stored tensors and config.expected_tensors(): missing,
  /// unexpected, wrong shape, non-floating dtype. Empty when the weights fit the config.
  std::vector<std::string> check_against(const ModelConfig& config) const;
  /// Throws SwarmError(INVALID_ARGUMENT) listing every problem check_against() finds.
  void validate_against(const ModelConfig& config) const;

 private:
  struct Entry {
    const TensorView* view;
    size_t file;
  };
  std::filesystem::path path_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
  std::map<std::string, std::string, std::less<>> aliases_;
};

// ---------------------------------------------------------------- writing

/// A tensor to write whose bytes are already in memory (little-endian, row-major).
struct TensorData {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
};

/// A tensor produced while writing: `fill` receives a buffer of exactly numel * dtype size
/// bytes to fill. Lets a writer stream a model larger than memory, one tensor at a time.
struct TensorSource {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::function<void(std::span<std::byte>)> fill;
};

/// Writes one safetensors file atomically (temporary file in the same directory + rename).
/// Tensors are laid out like the reference implementation: by dtype size (largest first, so
/// every tensor is aligned) then by name, packed without holes; the header is padded with
/// spaces to a multiple of 8 bytes. `metadata` gets "format": "pt" unless it sets "format"
/// (transformers refuses archives without it). Errors name the file and the tensor.
void write_safetensors(const std::filesystem::path& path, std::span<const TensorData> tensors,
                       const std::map<std::string, std::string>& metadata = {});
void write_safetensors(const std::filesystem::path& path, std::span<const TensorSource> tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Default shard size limit for write_safetensors_model (2 GB, decimal like Hugging Face's).
inline constexpr uint64_t kDefaultMaxShardBytes = 2'000'000'000;

struct ModelWriteResult {
  std::vector<std::filesystem::path> files;  // the .safetensors files written
  bool sharded = false;                      // true when an index.json was written
  uint64_t tensor_bytes = 0;                 // "total_size" of the index
};

/// Writes a model's weights into `dir` the way transformers' save_pretrained does:
/// model.safetensors when the tensors fit in `max_shard_bytes`, else
/// model-0000K-of-0000N.safetensors shards plus model.safetensors.index.json. Weight files of
/// an earlier save that are not part of this one are removed afterwards.
ModelWriteResult write_safetensors_model(const std::filesystem::path& dir,
                                         std::span<const TensorSource> tensors,
                                         uint64_t max_shard_bytes = kDefaultMaxShardBytes,
                                         const std::map<std::string, std::string>& metadata = {});
ModelWriteResult write_safetensors_model(const std::filesystem::path& dir,
                                         std::span<const TensorData> tensors,
                                         uint64_t max_shard_bytes = kDefaultMaxShardBytes,
                                         const std::map<std::string, std::string>& metadata = {});

}  // namespace swarm
