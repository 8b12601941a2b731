#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "common/json_nesting.hpp"
#include "model/file_io.hpp"
#include "model/model_config.hpp"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; swarm only supports little-endian hosts");

namespace swarm {

namespace {

using json = nlohmann::json;

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
  bool floating;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::BOOL, "BOOL", 1, false}, {DType::U8, "U8", 1, false},    {DType::I8, "I8", 1, false},
    {DType::I16, "I16", 2, false},   {DType::I32, "I32", 4, false},  {DType::I64, "I64", 8, false},
    {DType::F16, "F16", 2, true},    {DType::BF16, "BF16", 2, true}, {DType::F32, "F32", 4, true},
    {DType::F64, "F64", 8, true},
};

const DTypeInfo& info_of(DType d) noexcept { return kDTypes[static_cast<size_t>(d)]; }

std::string supported_dtypes() {
  std::string out;
  for (const auto& d : kDTypes) {
    if (!out.empty()) out += ", ";
    out += d.name;
  }
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Deeply nested JSON could exhaust the stack while the DOM is built or destroyed; a valid
// header nests three levels, so anything beyond a small bound is rejected before parsing.
bool nesting_within(const char* p, size_t n, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    char c = p[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

[[noreturn]] void header_error(std::string_view source, const std::string& message) {
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, std::string(source) + ": " + message);
}

}  // namespace

// ---------------------------------------------------------------- dtypes

size_t dtype_size(DType dtype) noexcept { return info_of(dtype).size; }
const char* dtype_name(DType dtype) noexcept { return info_of(dtype).name; }
bool dtype_is_floating(DType dtype) noexcept { return info_of(dtype).floating; }

std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  for (const auto& d : kDTypes) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

uint16_t f32_to_bf16(float value) noexcept {
  uint32_t u = std::bit_cast<uint32_t>(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit; a carry into the
  // exponent is the correct rounding (up to inf on overflow).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t bits) noexcept { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_f16(float value) noexcept {
  uint32_t u = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x47800000u) return sign | 0x7c00u;  // >= 65536: inf (or overflow)
  if (u < 0x38800000u) {
    // Below the smallest normal half (2^-14): adding 0.5 makes the float's rounding (RNE)
    // happen at exactly the half-subnormal step 2^-24; the low bits are then the result.
    float f = std::bit_cast<float>(u) + 0.5f;
    return sign | static_cast<uint16_t>(std::bit_cast<uint32_t>(f) - 0x3f000000u);
  }
  const uint32_t odd = (u >> 13) & 1u;
  u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias + RNE
  return sign | static_cast<uint16_t>(u >> 13);                 // carry may give inf: correct
}

float f16_to_f32(uint16_t bits) noexcept {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t mant = bits & 0x3ffu;
  if (exp == 0) {
    float mag = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

int64_t TensorView::numel() const noexcept {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> TensorView::to_f32() const {
  const size_t n = static_cast<size_t>(numel());
  std::vector<float> out(n);
  auto load = [&](auto tag, auto convert) {
    using T = decltype(tag);
    for (size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, data + i * sizeof(T), sizeof(T));  // views need not be aligned
      out[i] = convert(v);
    }
  };
  auto cast = [](auto v) { return static_cast<float>(v); };
  switch (dtype) {
    case DType::BOOL:
      load(uint8_t{}, [](uint8_t v) { return v ? 1.0f : 0.0f; });
      break;
    case DType::U8:
      load(uint8_t{}, cast);
      break;
    case DType::I8:
      load(int8_t{}, cast);
      break;
    case DType::I16:
      load(int16_t{}, cast);
      break;
    case DType::I32:
      load(int32_t{}, cast);
      break;
    case DType::I64:
      load(int64_t{}, cast);
      break;
    case DType::F16:
      load(uint16_t{}, f16_to_f32);
      break;
    case DType::BF16:
      load(uint16_t{}, bf16_to_f32);
      break;
    case DType::F32:
      if (n) std::memcpy(out.data(), data, n * 4);
      break;
    case DType::F64:
      load(double{}, cast);
      break;
  }
  return out;
}

// ---------------------------------------------------------------- header

SafetensorsHeader parse_safetensors_header(std::span<const std::byte> bytes, uint64_t file_size,
                                           std::string_view source) {
  auto fail = [source](const std::string& message) { header_error(source, message); };
  if (file_size < 8 || bytes.size() < 8) {
    fail("truncated: " + std::to_string(file_size < 8 ? file_size : bytes.size()) +
         " bytes, shorter than the 8-byte header length of a safetensors file");
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);  // little-endian (static_assert above)
  if (n > file_size - 8) {
    fail("malformed header: header length " + std::to_string(n) + " exceeds the file size (" +
         std::to_string(file_size) + " bytes); the file is truncated or not safetensors");
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    fail("malformed header: header length " + std::to_string(n) + " exceeds the limit of " +
         std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (bytes.size() - 8 < n) {
    fail("only " + std::to_string(bytes.size()) + " bytes of a " + std::to_string(8 + n) +
         "-byte header were given to the parser");
  }
  const char* text = reinterpret_cast<const char*>(bytes.data()) + 8;
  if (n == 0 || text[0] != '{') fail("malformed header: the JSON header must start with '{'");
  if (!nesting_within(text, n, 8)) fail("malformed header: JSON nested too deeply");

  json j;
  try {
    j = json::parse(text, text + n);
  } catch (const json::exception& e) {
    fail(std::string("malformed header: invalid JSON: ") + e.what());
  }
  if (!j.is_object()) fail("malformed header: the JSON header is not an object");

  SafetensorsHeader header;
  header.header_size = n;
  const uint64_t data_size = file_size - 8 - n;

  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail("malformed header: __metadata__ must be an object of strings");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail("malformed header: __metadata__ value of '" + mk + "' is not a string");
        header.metadata.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    const std::string where = "tensor '" + key + "': ";
    if (!value.is_object()) fail(where + "header entry is not an object");

    SafetensorsHeader::Entry e;
    e.name = key;
    auto dt = value.find("dtype");
    if (dt == value.end() || !dt->is_string()) fail(where + "missing or non-string 'dtype'");
    const std::string dtype_text = dt->get<std::string>();
    auto dtype = dtype_from_name(dtype_text);
    if (!dtype) fail(where + "unknown dtype '" + dtype_text + "' (supported: " + supported_dtypes() + ")");
    e.dtype = *dtype;

    auto sh = value.find("shape");
    if (sh == value.end() || !sh->is_array()) fail(where + "missing or non-array 'shape'");
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned())
        fail(where + "shape " + sh->dump() + " has an entry that is not a non-negative integer");
      uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(where + "shape dimension too large");
      e.shape.push_back(static_cast<int64_t>(dim));
      overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
    }
    uint64_t nbytes = 0;
    overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(e.dtype)), &nbytes);
    if (overflow) fail(where + "shape " + sh->dump() + " is too large");

    auto off = value.find("data_offsets");
    if (off == value.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      fail(where + "'data_offsets' must be two non-negative integers [begin, end]");
    }
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    const std::string range = "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.end < e.begin) fail(where + range + " end before begin");
    if (e.end > data_size) {
      fail(where + range + " point past the end of the data section (" + std::to_string(data_size) +
           " bytes); the file is truncated");
    }
    if (e.end - e.begin != nbytes) {
      fail(where + range + " hold " + std::to_string(e.end - e.begin) + " bytes, but shape " +
           shape_str(e.shape) + " of " + dtype_name(e.dtype) + " needs " + std::to_string(nbytes));
    }
    header.tensors.push_back(std::move(e));
  }

  // The tensors must tile the data section exactly (the format forbids holes and overlaps).
  std::vector<const SafetensorsHeader::Entry*> by_offset;
  by_offset.reserve(header.tensors.size());
  for (const auto& e : header.tensors) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const auto* a, const auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsHeader::Entry* previous = nullptr;
  for (const auto* e : by_offset) {
    if (e->begin < covered) {
      fail("tensor '" + e->name + "': data_offsets [" + std::to_string(e->begin) + ", " +
           std::to_string(e->end) + "] overlap tensor '" + previous->name + "'");
    }
    if (e->begin > covered) {
      fail("tensor '" + e->name + "': data_offsets start at " + std::to_string(e->begin) +
           ", leaving a hole of " + std::to_string(e->begin - covered) + " bytes in the data section");
    }
    covered = e->end;
    previous = e;
  }
  if (covered != data_size) {
    fail("the data section has " + std::to_string(data_size) + " bytes but the tensors cover " +
         std::to_string(covered) + " (trailing bytes after the last tensor)");
  }
  // j.items() iterates in key order, so header.tensors is already sorted by name.
  return header;
}

// ---------------------------------------------------------------- SafetensorsFile

SafetensorsFile::SafetensorsFile(Private, std::filesystem::path path, const std::byte* map, size_t size)
    : path_(std::move(path)), map_(map), size_(size) {}

SafetensorsFile::~SafetensorsFile() {
  if (map_ && size_) ::munmap(const_cast<std::byte*>(map_), size_);
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string name = path.string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, name + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, name + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    parse_safetensors_header({}, size, name);  // throws the "truncated" error
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, name + ": cannot mmap: " + std::strerror(map_errno));
  }
  auto file = std::make_shared<SafetensorsFile>(Private{}, path, static_cast<const std::byte*>(p), size);
  SafetensorsHeader header = parse_safetensors_header(file->bytes(), size, name);
  const std::byte* data = file->map_ + header.data_offset();
  file->tensors_.reserve(header.tensors.size());
  for (auto& e : header.tensors) {
    file->tensors_.push_back(TensorView{std::move(e.name), e.dtype, std::move(e.shape), data + e.begin,
                                        static_cast<size_t>(e.end - e.begin)});
  }
  file->metadata_ = std::move(header.metadata);
  return file;
}

const TensorView* SafetensorsFile::find(std::string_view name) const noexcept {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

const TensorView& SafetensorsFile::at(std::string_view name) const {
  if (const TensorView* t = find(name)) return *t;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                   path_.string() + ": missing tensor '" + std::string(name) + "'");
}

// ---------------------------------------------------------------- SafetensorsModel

namespace {

constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSingleFile = "model.safetensors";

// Shard names come from a file we did not write: keep them inside the model directory.
bool safe_relative(const std::string& name) {
  if (name.empty()) return false;
  std::filesystem::path p(name);
  if (p.is_absolute()) return false;
  for (const auto& part : p) {
    if (part == ".." || part == ".") return false;
  }
  return true;
}

}  // namespace

SafetensorsModel SafetensorsModel::open(const std::filesystem::path& path) {
  SafetensorsModel model;
  model.path_ = path;
  auto add_file = [&](std::shared_ptr<const SafetensorsFile> f) {
    const size_t index = model.files_.size();
    for (const auto& t : f->tensors()) {
      auto [it, inserted] = model.tensors_.emplace(t.name, Entry{&t, index});
      if (!inserted) {
        throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                         path.string() + ": tensor '" + t.name + "' is stored twice, in " +
                             model.files_[it->second.file]->path().filename().string() + " and " +
                             f->path().filename().string());
      }
    }
    model.files_.push_back(std::move(f));
  };

  if (std::filesystem::is_regular_file(path)) {
    add_file(SafetensorsFile::open(path));
  } else if (!std::filesystem::is_directory(path)) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, path.string() + ": no such model directory or file");
  } else if (std::filesystem::is_regular_file(path / kIndexFile)) {
    const std::filesystem::path index_path = path / kIndexFile;
    const std::string src = index_path.string();
    json index;
    try {
      const std::string text = read_text_file(index_path);
      require_json_nesting(text, src);
      index = json::parse(text);
    } catch (const json::exception& e) {
      throw SwarmError(ErrorKind::INVALID_ARGUMENT, src + ": invalid JSON: " + e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw SwarmError(ErrorKind::INVALID_ARGUMENT, src + ": missing object 'weight_map'");
    }
    const json& weight_map = index["weight_map"];
    std::set<std::string> shards;
    for (const auto& [name, file] : weight_map.items()) {
      if (!file.is_string() || !safe_relative(file.get<std::string>())) {
        throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                         src + ": weight_map entry of tensor '" + name +
                             "' is not a file name inside the model directory: " + file.dump());
      }
      shards.insert(file.get<std::string>());
    }
    if (shards.empty()) throw SwarmError(ErrorKind::INVALID_ARGUMENT, src + ": weight_map is empty");
    for (const auto& shard : shards) {
      if (!std::filesystem::is_regular_file(path / shard)) {
        throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                         src + ": shard '" + shard + "' listed in weight_map does not exist");
      }
      add_file(SafetensorsFile::open(path / shard));
    }
    for (const auto& [name, file] : weight_map.items()) {
      auto it = model.tensors_.find(name);
      const std::string shard = file.get<std::string>();
      if (it == model.tensors_.end() ||
          model.files_[it->second.file]->path().filename() != std::filesystem::path(shard).filename()) {
        throw SwarmError(ErrorKind::INVALID_ARGUMENT, src + ": weight_map puts tensor '" + name + "' in " +
                                                          shard + ", which does not contain it");
      }
    }
  } else if (std::filesystem::is_regular_file(path / kSingleFile)) {
    add_file(SafetensorsFile::open(path / kSingleFile));
  } else {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                     path.string() + ": no " + kSingleFile + " or " + kIndexFile + " in the model directory");
  }

  // Tied weights saved once: safetensors records {"dropped name": "kept name"} in metadata.
  for (const auto& f : model.files_) {
    for (const auto& [k, v] : f->metadata()) {
      if (!model.tensors_.count(k) && model.tensors_.count(v)) model.aliases_.emplace(k, v);
    }
  }
  return model;
}

const TensorView* SafetensorsModel::find(std::string_view name) const noexcept {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second.view;
  auto alias = aliases_.find(name);
  if (alias != aliases_.end()) {
    it = tensors_.find(alias->second);
    if (it != tensors_.end()) return it->second.view;
  }
  return nullptr;
}

const TensorView& SafetensorsModel::at(std::string_view name) const {
  if (const TensorView* t = find(name)) return *t;
  throw SwarmError(ErrorKind::INVALID_ARGUMENT,
                   path_.string() + ": missing tensor '" + std::string(name) + "'");
}

std::shared_ptr<const SafetensorsFile> SafetensorsModel::file_of(std::string_view name) const noexcept {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    auto alias = aliases_.find(name);
    if (alias == aliases_.end()) return nullptr;
    it = tensors_.find(alias->second);
    if (it == tensors_.end()) return nullptr;
  }
  return files_[it->second.file];
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) out.push_back(name);
  return out;
}

uint64_t SafetensorsModel::file_bytes() const noexcept {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->bytes().size();
  return n;
}

std::vector<std::string> SafetensorsModel::check_against(const ModelConfig& config) const {
  std::vector<std::string> problems;
  auto file_name = [&](const std::string& stored) {
    return files_[tensors_.find(stored)->second.file]->path().filename().string();
  };
  auto check = [&](const std::string& name, const std::vector<int64_t>& shape, const TensorView& t) {
    if (t.shape != shape) {
      problems.push_back("tensor '" + name + "' in " + file_name(t.name) + " has shape " +
                         shape_str(t.shape) + ", expected " + shape_str(shape));
    }
    if (!dtype_is_floating(t.dtype)) {
      problems.push_back("tensor '" + name + "' in " + file_name(t.name) + " has dtype " +
                         dtype_name(t.dtype) + ", expected a floating-point dtype (F32, BF16, F16, F64)");
    }
  };

  std::set<std::string, std::less<>> expected;
  const std::string embed = "model.embed_tokens.weight";
  const std::string head = "lm_head.weight";
  for (const auto& spec : config.expected_tensors()) {
    expected.insert(spec.name);
    const TensorView* t = find(spec.name);
    if (spec.name == embed && config.tie_word_embeddings && !t) t = find(head);  // tied, kept as lm_head
    if (!t) {
      problems.push_back("missing tensor '" + spec.name + "' (expected shape " + shape_str(spec.shape) + ")");
      continue;
    }
    check(spec.name, spec.shape, *t);
  }
  if (config.tie_word_embeddings) {
    // A tied checkpoint may carry lm_head.weight as well (or only); it must then look like the embedding.
    expected.insert(head);
    if (const TensorView* t = find(head)) check(head, {config.vocab_size, config.hidden_size}, *t);
  }
  for (const auto& [name, entry] : tensors_) {
    if (expected.count(name)) continue;
    // Old Llama checkpoints carry the RoPE buffer; it is recomputed, never loaded.
    if (name.ends_with(".rotary_emb.inv_freq")) continue;
    problems.push_back("unexpected tensor '" + name + "' in " + file_name(name) + " (shape " +
                       shape_str(entry.view->shape) + ")");
  }
  return problems;
}

void SafetensorsModel::validate_against(const ModelConfig& config) const {
  std::vector<std::string> problems = check_against(config);
  if (problems.empty()) return;
  constexpr size_t kMaxListed = 100;
  std::string message = path_.string() + ": the tensors do not match config.json (" +
                        config.architecture_name + ", " + std::to_string(config.num_hidden_layers) +
                        " layers): " + std::to_string(problems.size()) + " problem" +
                        (problems.size() == 1 ? "" : "s");
  for (size_t i = 0; i < problems.size() && i < kMaxListed; ++i) message += "\n  - " + problems[i];
  if (problems.size() > kMaxListed) {
    message += "\n  - ... and " + std::to_string(problems.size() - kMaxListed) + " more";
  }
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, message);
}

}  // namespace swarm
