// The safetensors writer (declared in safetensors.hpp).
#include <algorithm>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "model/file_io.hpp"
#include "model/safetensors.hpp"

namespace swarm {

namespace {

using json = nlohmann::json;
using FillFn = std::function<void(std::span<std::byte>)>;

// One tensor to write, from either a byte span or a fill callback.
struct Item {
  const std::string* name;
  DType dtype;
  const std::vector<int64_t>* shape;
  uint64_t nbytes;
  std::span<const std::byte> bytes;
  const FillFn* fill;
};

[[noreturn]] void write_error(const std::filesystem::path& where, const std::string& message) {
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "write_safetensors(" + where.string() + "): " + message);
}

uint64_t byte_size(const std::filesystem::path& where, const std::string& name, DType dtype,
                   const std::vector<int64_t>& shape) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) write_error(where, "tensor '" + name + "' has a negative dimension");
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
      write_error(where, "tensor '" + name + "' is too large");
  }
  return n;
}

// Same order as the reference implementation: larger dtypes first (keeps every tensor aligned
// to its element size when the data section starts 8-aligned), then by name.
void sort_items(std::vector<Item>& items) {
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    size_t sa = dtype_size(a.dtype), sb = dtype_size(b.dtype);
    return sa != sb ? sa > sb : *a.name < *b.name;
  });
}

void check_names(const std::filesystem::path& where, const std::vector<Item>& items) {
  std::set<std::string_view> seen;
  for (const auto& it : items) {
    if (it.name->empty()) write_error(where, "a tensor has an empty name");
    if (*it.name == "__metadata__") write_error(where, "'__metadata__' cannot be a tensor name");
    if (!seen.insert(*it.name).second) write_error(where, "tensor '" + *it.name + "' is given twice");
  }
}

std::vector<Item> items_of(const std::filesystem::path& where, std::span<const TensorData> tensors) {
  std::vector<Item> items;
  items.reserve(tensors.size());
  for (const auto& t : tensors) {
    uint64_t n = byte_size(where, t.name, t.dtype, t.shape);
    if (t.bytes.size() != n) {
      std::string shape;
      for (int64_t d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      write_error(where, "tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) +
                             " bytes, but shape [" + shape + "] of " + dtype_name(t.dtype) + " needs " +
                             std::to_string(n));
    }
    items.push_back(Item{&t.name, t.dtype, &t.shape, n, t.bytes, nullptr});
  }
  check_names(where, items);
  return items;
}

std::vector<Item> items_of(const std::filesystem::path& where, std::span<const TensorSource> tensors) {
  std::vector<Item> items;
  items.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (!t.fill) write_error(where, "tensor '" + t.name + "' has no fill function");
    items.push_back(
        Item{&t.name, t.dtype, &t.shape, byte_size(where, t.name, t.dtype, t.shape), {}, &t.fill});
  }
  check_names(where, items);
  return items;
}

void write_file(const std::filesystem::path& path, std::vector<Item> items,
                const std::map<std::string, std::string>& metadata) {
  sort_items(items);
  std::map<std::string, std::string> meta = metadata;
  meta.emplace("format", "pt");

  // Compact JSON like the reference writer: metadata first, then tensors in data order.
  std::string header = "{\"__metadata__\":" + json(meta).dump();
  uint64_t offset = 0;
  for (const auto& it : items) {
    header += "," + json(*it.name).dump() + ":{\"dtype\":\"" + dtype_name(it.dtype) +
              "\",\"shape\":" + json(*it.shape).dump() + ",\"data_offsets\":[" + std::to_string(offset) +
              "," + std::to_string(offset + it.nbytes) + "]}";
    offset += it.nbytes;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // data section starts 8-aligned

  AtomicFile out(path);
  unsigned char len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(std::as_bytes(std::span<const unsigned char>(len, 8)));
  out.write(header);
  std::vector<std::byte> buffer;
  for (const auto& it : items) {
    if (it.fill) {
      buffer.resize(it.nbytes);
      std::span<std::byte> dst(buffer.data(), it.nbytes);
      (*it.fill)(dst);
      out.write(dst);
    } else {
      out.write(it.bytes);
    }
  }
  out.commit();
}

bool is_weight_file_name(const std::string& name) {
  if (name == "model.safetensors" || name == "model.safetensors.index.json") return true;
  // model-00001-of-00003.safetensors
  auto digits = [&](size_t pos) {
    for (size_t i = pos; i < pos + 5; ++i) {
      if (name[i] < '0' || name[i] > '9') return false;
    }
    return true;
  };
  return name.size() == 32 && name.starts_with("model-") && digits(6) && name.compare(11, 4, "-of-") == 0 &&
         digits(15) && name.compare(20, 12, ".safetensors") == 0;
}

std::string shard_name(size_t index, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return buf;
}

ModelWriteResult write_model(const std::filesystem::path& dir, std::vector<Item> items,
                             uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes == 0) write_error(dir, "max_shard_bytes must be positive");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) write_error(dir, "cannot create the directory: " + ec.message());

  sort_items(items);
  ModelWriteResult result;
  for (const auto& it : items) result.tensor_bytes += it.nbytes;

  std::set<std::string> written;
  if (result.tensor_bytes <= max_shard_bytes) {
    write_file(dir / "model.safetensors", std::move(items), metadata);
    result.files.push_back(dir / "model.safetensors");
    written.insert("model.safetensors");
  } else {
    // Greedy, in write order; a tensor larger than the limit gets a shard of its own.
    std::vector<std::vector<Item>> shards(1);
    uint64_t current = 0;
    for (const auto& it : items) {
      if (!shards.back().empty() && current + it.nbytes > max_shard_bytes) {
        shards.emplace_back();
        current = 0;
      }
      shards.back().push_back(it);
      current += it.nbytes;
    }
    json weight_map = json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string name = shard_name(i, shards.size());
      for (const auto& it : shards[i]) weight_map[*it.name] = name;
      write_file(dir / name, std::move(shards[i]), metadata);
      result.files.push_back(dir / name);
      written.insert(name);
    }
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", result.tensor_bytes}};
    index["weight_map"] = weight_map;  // sorted by tensor name
    write_text_file_atomic(dir / "model.safetensors.index.json", index.dump(2) + "\n");
    written.insert("model.safetensors.index.json");
    result.sharded = true;
  }

  // Leftovers of an earlier save would shadow or contradict this one.
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && is_weight_file_name(name) && !written.count(name)) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  return result;
}

}  // namespace

void write_safetensors(const std::filesystem::path& path, std::span<const TensorData> tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file(path, items_of(path, tensors), metadata);
}

void write_safetensors(const std::filesystem::path& path, std::span<const TensorSource> tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file(path, items_of(path, tensors), metadata);
}

ModelWriteResult write_safetensors_model(const std::filesystem::path& dir,
                                         std::span<const TensorSource> tensors, uint64_t max_shard_bytes,
                                         const std::map<std::string, std::string>& metadata) {
  return write_model(dir, items_of(dir, tensors), max_shard_bytes, metadata);
}

ModelWriteResult write_safetensors_model(const std::filesystem::path& dir,
                                         std::span<const TensorData> tensors, uint64_t max_shard_bytes,
                                         const std::map<std::string, std::string>& metadata) {
  return write_model(dir, items_of(dir, tensors), max_shard_bytes, metadata);
}

}  // namespace swarm
