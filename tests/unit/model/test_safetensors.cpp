// safetensors reader / writer / sharded models / validation / random init, checked against
// the real TinyStories checkpoint and against an independent reader written with Python's
// json + numpy (run with /usr/bin/python3, see scripts/setup.sh).
#include <gtest/gtest.h>

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "model/file_io.hpp"
#include "model/model_config.hpp"
#include "model/model_tools.hpp"
#include "model/safetensors.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path fixture_model(const char* name) { return fs::path(SWARM_FIXTURES_DIR) / "models" / name; }
fs::path tinystories() { return fixture_model("tinystories-656k"); }
fs::path smollm2() { return fixture_model("smollm2-135m-instruct-noweights"); }

#define REQUIRE_FIXTURE(dir)                                                       \
  ASSERT_TRUE(fs::is_directory(dir)) << "test fixture missing: " << (dir)          \
                                     << " (SWARM_FIXTURES_DIR=" SWARM_FIXTURES_DIR \
                                        "; see tests/fixtures/README.md)"

constexpr const char* kPython = "/usr/bin/python3";

// An independent safetensors reader: checks the reference implementation's layout rules
// (tensors tile the data section exactly, sizes match) and dumps every tensor's bytes as numpy
// sees them, plus a float64 sum, to OUTDIR/manifest.json + OUTDIR/<i>.bin.
constexpr const char* kReferenceReader = R"PY(
import json, os, struct, sys
import numpy as np
path, outdir = sys.argv[1], sys.argv[2]
b = open(path, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
header = json.loads(b[8:8 + n].decode('utf-8'))
meta = header.pop('__metadata__', {})
size = {'F32': 4, 'F16': 2, 'BF16': 2, 'F64': 8, 'I64': 8, 'I32': 4, 'I16': 2, 'I8': 1, 'U8': 1, 'BOOL': 1}
npd = {'F32': np.float32, 'F16': np.float16, 'BF16': np.uint16, 'F64': np.float64, 'I64': np.int64,
       'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U8': np.uint8, 'BOOL': np.bool_}
pos = 0
for name, info in sorted(header.items(), key=lambda kv: tuple(kv[1]['data_offsets'])):
    s, e = info['data_offsets']
    if s != pos: sys.exit('%s: hole or overlap at %d (expected %d)' % (name, s, pos))
    numel = int(np.prod(info['shape'], dtype=np.int64))
    if e - s != numel * size[info['dtype']]: sys.exit('%s: wrong byte count' % name)
    pos = e
if 8 + n + pos != len(b): sys.exit('data section does not end at the end of the file')
manifest = {'header_size': n, 'metadata': meta, 'tensors': {}}
for i, (name, info) in enumerate(sorted(header.items())):
    s, e = info['data_offsets']
    numel = int(np.prod(info['shape'], dtype=np.int64))
    arr = np.frombuffer(b, dtype=npd[info['dtype']], count=numel, offset=8 + n + s).reshape(info['shape'])
    if info['dtype'] == 'BF16':
        values = (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    else:
        values = arr.astype(np.float64)
    open(os.path.join(outdir, '%d.bin' % i), 'wb').write(arr.tobytes())
    manifest['tensors'][name] = {'dtype': info['dtype'], 'shape': info['shape'], 'file': '%d.bin' % i,
                                 'sum': float(values.sum()),
                                 'aligned': (8 + n + s) % size[info['dtype']] == 0}
json.dump(manifest, open(os.path.join(outdir, 'manifest.json'), 'w'))
print('ok', len(manifest['tensors']))
)PY";

// Reference conversions: numpy's float32 -> float16 and torch's float32 -> bfloat16 (both
// round-to-nearest-even), and every float16 bit pattern -> float32.
constexpr const char* kReferenceConversions = R"PY(
import sys, warnings
import numpy as np, torch
warnings.simplefilter('ignore')
np.seterr(all='ignore')
d = sys.argv[1]
x = np.fromfile(d + '/in_f32.bin', dtype=np.float32)
x.astype(np.float16).view(np.uint16).tofile(d + '/ref_f16.bin')
torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).tofile(d + '/ref_bf16.bin')
np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32).tofile(d + '/ref_f16_to_f32.bin')
print('ok')
)PY";

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return std::move(out).str();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const SwarmError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a SwarmError";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle)                                                            \
  do {                                                                                               \
    const std::string h_ = (haystack);                                                               \
    EXPECT_NE(h_.find(needle), std::string::npos) << "message: " << h_ << "\nmissing: " << (needle); \
  } while (0)

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    tmp_ = fs::temp_directory_path() /
           ("swarm-safetensors-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }

  // Runs a Python reference script; returns its output, failing the test on a non-zero exit.
  std::string python(const char* script, const std::vector<std::string>& args) {
    if (!fs::exists(kPython)) {
      ADD_FAILURE() << kPython << " not found: the parity checks need Debian's python3 with numpy and torch "
                    << "(scripts/setup.sh)";
      return "";
    }
    const fs::path path = tmp_ / ("script" + std::to_string(scripts_++) + ".py");
    std::ofstream(path) << script;
    std::string cmd = std::string(kPython) + " " + path.string();
    for (const auto& a : args) cmd += " '" + a + "'";
    cmd += " 2>&1";
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int status = ::pclose(p);
    EXPECT_EQ(status, 0) << cmd << "\n" << out;
    return out;
  }

  // Reads `file` with the independent Python reader and compares every tensor with ours.
  void expect_python_agrees(const fs::path& file) {
    const fs::path out = tmp_ / ("ref" + std::to_string(scripts_));
    fs::create_directories(out);
    const std::string log = python(kReferenceReader, {file.string(), out.string()});
    ASSERT_EQ(log.rfind("ok", 0), 0u) << log;
    const json manifest = json::parse(read_bytes(out / "manifest.json"));
    const auto ours = SafetensorsFile::open(file);
    ASSERT_EQ(manifest["tensors"].size(), ours->tensors().size());
    EXPECT_EQ((8 + manifest["header_size"].get<uint64_t>()) % 8, 0u) << "data section not 8-aligned";
    for (const auto& t : ours->tensors()) {
      SCOPED_TRACE(t.name);
      ASSERT_TRUE(manifest["tensors"].contains(t.name));
      const json& ref = manifest["tensors"][t.name];
      EXPECT_EQ(ref["dtype"].get<std::string>(), dtype_name(t.dtype));
      EXPECT_EQ(ref["shape"].get<std::vector<int64_t>>(), t.shape);
      EXPECT_TRUE(ref["aligned"].get<bool>());
      const std::string bytes = read_bytes(out / ref["file"].get<std::string>());
      ASSERT_EQ(bytes.size(), t.nbytes);
      EXPECT_EQ(std::memcmp(bytes.data(), t.data, t.nbytes), 0) << "bytes differ";
      double sum = 0;
      for (float v : t.to_f32()) sum += v;
      EXPECT_NEAR(sum, ref["sum"].get<double>(), 1e-6 * (1 + std::fabs(sum)));
    }
  }

  // A file made of an explicit header length, header text and zeroed data.
  fs::path raw_file(const std::string& name, const std::string& header, size_t data_bytes,
                    std::optional<uint64_t> header_len = std::nullopt) {
    const fs::path p = tmp_ / name;
    std::ofstream out(p, std::ios::binary);
    uint64_t n = header_len.value_or(header.size());
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(data_bytes, '\0');
    return p;
  }

  std::vector<TensorData> tinystories_tensors(const SafetensorsFile& file) {
    std::vector<TensorData> out;
    for (const auto& t : file.tensors()) out.push_back({t.name, t.dtype, t.shape, {t.data, t.nbytes}});
    return out;
  }

  fs::path tmp_;
  int scripts_ = 0;
};

// ---------------------------------------------------------------- the real checkpoint

TEST_F(SafetensorsTest, TinyStoriesLoadsMatchesConfigAndAgreesWithPython) {
  REQUIRE_FIXTURE(tinystories());
  const SafetensorsModel model = SafetensorsModel::open(tinystories());
  const ModelConfig config = ModelConfig::from_directory(tinystories());
  EXPECT_EQ(model.size(), 20u);
  EXPECT_EQ(model.files().size(), 1u);
  EXPECT_NO_THROW(model.validate_against(config));
  EXPECT_TRUE(model.check_against(config).empty());

  // Saved tied: the embedding lives under lm_head.weight with an alias in __metadata__.
  EXPECT_EQ(model.aliases().at("model.embed_tokens.weight"), "lm_head.weight");
  EXPECT_EQ(model.find("model.embed_tokens.weight"), model.find("lm_head.weight"));
  EXPECT_EQ(model.file_of("model.embed_tokens.weight"), model.files()[0]);

  int64_t stored = 0;
  for (const auto& name : model.names()) {
    const TensorView& t = model.at(name);
    EXPECT_EQ(t.dtype, DType::F32);
    EXPECT_EQ(t.nbytes, static_cast<size_t>(t.numel()) * 4);
    for (float v : t.to_f32()) ASSERT_TRUE(std::isfinite(v)) << name;
    stored += t.numel();
  }
  EXPECT_EQ(stored, config.parameter_count());
  const TensorView& norm = model.at("model.norm.weight");
  EXPECT_EQ(norm.shape, std::vector<int64_t>{128});
  EXPECT_CONTAINS(error_of([&] { model.at("model.layers.9.mlp.up_proj.weight"); }),
                  "missing tensor 'model.layers.9.mlp.up_proj.weight'");

  expect_python_agrees(tinystories() / "model.safetensors");
}

TEST_F(SafetensorsTest, WriterReproducesTheReferenceWritersBytes) {
  REQUIRE_FIXTURE(tinystories());
  const auto original = SafetensorsFile::open(tinystories() / "model.safetensors");
  const auto tensors = tinystories_tensors(*original);
  write_safetensors(tmp_ / "copy.safetensors", tensors, original->metadata());
  // Same tensors, same metadata: the file the Python safetensors library wrote, byte for byte.
  EXPECT_EQ(read_bytes(tmp_ / "copy.safetensors"), read_bytes(tinystories() / "model.safetensors"));

  const auto copy = SafetensorsFile::open(tmp_ / "copy.safetensors");
  ASSERT_EQ(copy->tensors().size(), original->tensors().size());
  for (size_t i = 0; i < copy->tensors().size(); ++i) {
    const TensorView& a = original->tensors()[i];
    const TensorView& b = copy->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.shape, b.shape);
    ASSERT_EQ(a.nbytes, b.nbytes);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0) << a.name;
  }
  EXPECT_EQ(copy->metadata(), original->metadata());
  expect_python_agrees(tmp_ / "copy.safetensors");

  // No temporary file is left next to the result.
  for (const auto& e : fs::directory_iterator(tmp_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

TEST_F(SafetensorsTest, ShardedWriteProducesAnIndexAndLoadsBack) {
  REQUIRE_FIXTURE(tinystories());
  const auto original = SafetensorsFile::open(tinystories() / "model.safetensors");
  const auto tensors = tinystories_tensors(*original);
  const fs::path dir = tmp_ / "sharded";

  const ModelWriteResult r = write_safetensors_model(dir, tensors, 700'000, original->metadata());
  EXPECT_TRUE(r.sharded);
  EXPECT_EQ(r.files.size(), 4u);  // lm_head (1 MiB) alone, then ~700 KB shards
  EXPECT_EQ(r.tensor_bytes, 2624000u);
  EXPECT_EQ(r.files[0].filename(), "model-00001-of-00004.safetensors");
  const json index = json::parse(read_bytes(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 2624000);
  EXPECT_EQ(index["weight_map"].size(), 20u);
  EXPECT_EQ(index["weight_map"]["lm_head.weight"], "model-00001-of-00004.safetensors");

  const SafetensorsModel model = SafetensorsModel::open(dir);
  EXPECT_EQ(model.files().size(), 4u);
  EXPECT_EQ(model.size(), 20u);
  EXPECT_NO_THROW(model.validate_against(ModelConfig::from_directory(tinystories())));
  for (const auto& t : original->tensors()) {
    const TensorView& got = model.at(t.name);
    ASSERT_EQ(got.nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(got.data, t.data, t.nbytes), 0) << t.name;
  }
  EXPECT_EQ(model.find("model.embed_tokens.weight"), model.find("lm_head.weight"));
  for (const auto& f : r.files) expect_python_agrees(f);

  // Saving again unsharded removes the old shards and index, and the other way round.
  write_safetensors_model(dir, tensors);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, std::set<std::string>{"model.safetensors"});
  write_safetensors_model(dir, tensors, 1'500'000);
  names.clear();
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names,
            (std::set<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                   "model.safetensors.index.json"}));
}

// ---------------------------------------------------------------- writer layout and errors

TEST_F(SafetensorsTest, MixedDtypesAreLaidOutAlignedAndReadBack) {
  const std::vector<int8_t> i8 = {1, -2, 3};
  const std::vector<float> f32 = {1.5f, -2.25f};
  const std::vector<uint16_t> bf16 = {f32_to_bf16(1.0f), f32_to_bf16(-3.0f), f32_to_bf16(0.5f)};
  const std::vector<int64_t> i64 = {-(int64_t{1} << 40)};
  const float scalar = 42.0f;
  const std::vector<TensorData> tensors = {
      {"a.i8", DType::I8, {3}, std::as_bytes(std::span(i8))},
      {"b.f32", DType::F32, {2, 1}, std::as_bytes(std::span(f32))},
      {"c.bf16", DType::BF16, {3}, std::as_bytes(std::span(bf16))},
      {"d.i64", DType::I64, {1}, std::as_bytes(std::span(i64))},
      {"e.scalar", DType::F32, {}, std::as_bytes(std::span(&scalar, 1))},
      {"f.empty", DType::F32, {0, 4}, {}},
  };
  const fs::path path = tmp_ / "mixed.safetensors";
  write_safetensors(path, tensors, {{"note", "hello \"world\""}});
  const auto file = SafetensorsFile::open(path);
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("note"), "hello \"world\"");
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (const auto& t : tensors) {
    const TensorView& v = file->at(t.name);
    EXPECT_EQ(v.dtype, t.dtype);
    EXPECT_EQ(v.shape, t.shape);
    ASSERT_EQ(v.nbytes, t.bytes.size());
    if (v.nbytes) {
      EXPECT_EQ(std::memcmp(v.data, t.bytes.data(), v.nbytes), 0) << t.name;
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype), 0u) << t.name << " unaligned";
  }
  EXPECT_EQ(file->at("c.bf16").to_f32(), (std::vector<float>{1.0f, -3.0f, 0.5f}));
  EXPECT_EQ(file->at("e.scalar").numel(), 1);
  expect_python_agrees(path);
}

TEST_F(SafetensorsTest, WriterErrorsNameTheFileAndTensor) {
  const std::vector<float> two = {1, 2};
  const fs::path path = tmp_ / "bad.safetensors";
  const std::vector<TensorData> short_data = {{"w", DType::F32, {3}, std::as_bytes(std::span(two))}};
  const std::string msg = error_of([&] { write_safetensors(path, short_data); });
  EXPECT_CONTAINS(msg, path.string());
  EXPECT_CONTAINS(msg, "tensor 'w' has 8 bytes, but shape [3] of F32 needs 12");
  const std::vector<TensorData> twice = {{"w", DType::F32, {2}, std::as_bytes(std::span(two))},
                                         {"w", DType::F32, {2}, std::as_bytes(std::span(two))}};
  EXPECT_CONTAINS(error_of([&] { write_safetensors(path, twice); }), "tensor 'w' is given twice");
  const std::vector<TensorData> reserved = {{"__metadata__", DType::F32, {2}, std::as_bytes(std::span(two))}};
  EXPECT_CONTAINS(error_of([&] { write_safetensors(path, reserved); }),
                  "'__metadata__' cannot be a tensor name");
  EXPECT_FALSE(fs::exists(path));
}

// ---------------------------------------------------------------- malformed files

TEST_F(SafetensorsTest, MalformedFilesGiveClearErrors) {
  struct Case {
    const char* what;
    fs::path file;
    std::vector<std::string> expected;
  };
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  std::vector<Case> cases;

  {
    const fs::path p = tmp_ / "tiny.safetensors";
    std::ofstream(p, std::ios::binary) << "abc";
    cases.push_back({"shorter than 8 bytes", p, {"truncated: 3 bytes"}});
  }
  cases.push_back({"header length too big",
                   raw_file("big.safetensors", "{" + ok_entry + "}", 8, 1'000'000'000'000),
                   {"header length 1000000000000 exceeds the file size"}});
  cases.push_back({"bad JSON",
                   raw_file("json.safetensors", R"({"w":{"dtype":"F32",,}})", 8),
                   {"malformed header: invalid JSON"}});
  cases.push_back({"not an object", raw_file("array.safetensors", "[1, 2]", 0), {"must start with '{'"}});
  cases.push_back({"overlapping offsets",
                   raw_file("overlap.safetensors",
                            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            12),
                   {"tensor 'b'", "overlap tensor 'a'"}});
  cases.push_back(
      {"wrong byte count",
       raw_file("count.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4),
       {"tensor 'w'", "hold 4 bytes, but shape [2] of F32 needs 8"}});
  cases.push_back(
      {"unknown dtype",
       raw_file("dtype.safetensors", R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2),
       {"tensor 'w'", "unknown dtype 'F8_E4M3'"}});
  cases.push_back({"offsets past the end",
                   raw_file("past.safetensors", "{" + ok_entry + "}", 4),
                   {"tensor 'w'", "past the end of the data section (4 bytes); the file is truncated"}});
  cases.push_back(
      {"hole",
       raw_file("hole.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       {"tensor 'w'", "hole of 4 bytes"}});
  cases.push_back(
      {"trailing bytes", raw_file("trailing.safetensors", "{" + ok_entry + "}", 16), {"trailing bytes"}});
  cases.push_back(
      {"negative dim",
       raw_file("neg.safetensors", R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       {"tensor 'w'", "not a non-negative integer"}});
  cases.push_back(
      {"offsets arity",
       raw_file("arity.safetensors", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
       {"tensor 'w'", "'data_offsets' must be two non-negative integers"}});
  cases.push_back({"metadata value",
                   raw_file("meta.safetensors", R"({"__metadata__":{"n":1},)" + ok_entry + "}", 8),
                   {"__metadata__ value of 'n' is not a string"}});
  cases.push_back({"entry not an object",
                   raw_file("entry.safetensors", R"({"w":[1]})", 0),
                   {"tensor 'w': header entry is not an object"}});
  cases.push_back(
      {"deep nesting",
       raw_file("deep.safetensors", "{\"w\":" + std::string(100, '[') + std::string(100, ']') + "}", 0),
       {"nested too deeply"}});
  if (fs::is_directory(tinystories())) {
    const std::string full = read_bytes(tinystories() / "model.safetensors");
    const fs::path cut = tmp_ / "cut.safetensors";
    std::ofstream(cut, std::ios::binary) << full.substr(0, full.size() / 2);
    cases.push_back({"truncated data", cut, {"past the end of the data section", "the file is truncated"}});
  }

  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string msg = error_of([&] { SafetensorsFile::open(c.file); });
    EXPECT_CONTAINS(msg, c.file.string() + ": ");
    for (const auto& e : c.expected) EXPECT_CONTAINS(msg, e);
  }

  EXPECT_CONTAINS(error_of([&] { SafetensorsFile::open(tmp_ / "nope.safetensors"); }), "cannot open");
  EXPECT_CONTAINS(error_of([&] { SafetensorsModel::open(tmp_); }),
                  "no model.safetensors or model.safetensors.index.json");
}

TEST_F(SafetensorsTest, HeaderParserWorksOnMemoryBuffers) {
  const std::string header =
      R"({"__metadata__":{"k":"v"},"x":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header + std::string(8, '\0');
  const auto bytes = std::as_bytes(std::span(file.data(), file.size()));
  const SafetensorsHeader h = parse_safetensors_header(bytes, file.size(), "buf");
  ASSERT_EQ(h.tensors.size(), 1u);
  EXPECT_EQ(h.tensors[0].dtype, DType::BF16);
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(h.data_offset(), 8 + n);
  EXPECT_EQ(h.metadata.at("k"), "v");
  // Fewer bytes than the header needs: an error, never a read past the buffer.
  EXPECT_CONTAINS(error_of([&] { parse_safetensors_header(bytes.first(20), file.size(), "buf"); }),
                  "bytes of a");
}

TEST_F(SafetensorsTest, ShardIndexErrors) {
  const std::vector<float> two = {1, 2};
  const std::vector<TensorData> t = {{"w", DType::F32, {2}, std::as_bytes(std::span(two))}};
  const fs::path dir = tmp_ / "m";
  fs::create_directories(dir);
  write_safetensors(dir / "a.safetensors", t);
  auto index = [&](const json& weight_map) {
    std::ofstream(dir / "model.safetensors.index.json")
        << json{{"metadata", json::object()}, {"weight_map", weight_map}};
  };
  index({{"w", "missing.safetensors"}});
  EXPECT_CONTAINS(error_of([&] { SafetensorsModel::open(dir); }),
                  "shard 'missing.safetensors' listed in weight_map does not exist");
  write_safetensors(dir / "b.safetensors",
                    std::vector<TensorData>{{"v", DType::F32, {2}, std::as_bytes(std::span(two))}});
  index({{"w", "a.safetensors"}, {"x", "b.safetensors"}});
  EXPECT_CONTAINS(error_of([&] { SafetensorsModel::open(dir); }),
                  "weight_map puts tensor 'x' in b.safetensors, which does not contain it");
  index({{"w", "../m/a.safetensors"}});
  EXPECT_CONTAINS(error_of([&] { SafetensorsModel::open(dir); }),
                  "is not a file name inside the model directory");
  write_safetensors(dir / "c.safetensors", t);
  index({{"w", "a.safetensors"}, {"v", "c.safetensors"}});
  EXPECT_CONTAINS(error_of([&] { SafetensorsModel::open(dir); }),
                  "tensor 'w' is stored twice, in a.safetensors and c.safetensors");
  std::ofstream(dir / "model.safetensors.index.json") << "{";
  EXPECT_CONTAINS(error_of([&] { SafetensorsModel::open(dir); }),
                  "model.safetensors.index.json: invalid JSON");
}

// ---------------------------------------------------------------- validation against config

TEST_F(SafetensorsTest, ValidateAgainstReportsEveryProblemAtOnce) {
  REQUIRE_FIXTURE(tinystories());
  const SafetensorsModel model = SafetensorsModel::open(tinystories());
  ModelConfig config = ModelConfig::from_directory(tinystories());

  ModelConfig deeper = config;
  deeper.num_hidden_layers = 3;
  std::string msg = error_of([&] { model.validate_against(deeper); });
  EXPECT_CONTAINS(msg, tinystories().string());
  EXPECT_CONTAINS(msg, ": 9 problems");
  EXPECT_CONTAINS(msg, "missing tensor 'model.layers.2.self_attn.q_proj.weight' (expected shape [128, 128])");
  EXPECT_CONTAINS(msg, "missing tensor 'model.layers.2.post_attention_layernorm.weight'");

  ModelConfig wider = config;
  wider.intermediate_size = 512;
  msg = error_of([&] { model.validate_against(wider); });
  EXPECT_CONTAINS(msg,
                  "tensor 'model.layers.0.mlp.gate_proj.weight' in model.safetensors has shape [384, 128], "
                  "expected [512, 128]");
  EXPECT_CONTAINS(msg, ": 6 problems");

  // An extra tensor, an integer tensor and a missing one, written as a custom checkpoint.
  const auto original = SafetensorsFile::open(tinystories() / "model.safetensors");
  std::vector<TensorData> tensors;
  std::vector<int32_t> ints(128, 1);
  for (const auto& t : original->tensors()) {
    if (t.name == "model.layers.1.mlp.up_proj.weight") continue;
    if (t.name == "model.norm.weight") {
      tensors.push_back({t.name, DType::I32, t.shape, std::as_bytes(std::span(ints))});
      continue;
    }
    tensors.push_back({t.name, t.dtype, t.shape, {t.data, t.nbytes}});
  }
  const float extra = 1.0f;
  tensors.push_back({"model.extra.weight", DType::F32, {1}, std::as_bytes(std::span(&extra, 1))});
  tensors.push_back(
      {"model.layers.0.self_attn.rotary_emb.inv_freq", DType::F32, {1}, std::as_bytes(std::span(&extra, 1))});
  write_safetensors_model(tmp_ / "custom", tensors, kDefaultMaxShardBytes, original->metadata());
  const SafetensorsModel custom = SafetensorsModel::open(tmp_ / "custom");
  const auto problems = custom.check_against(config);
  EXPECT_EQ(problems.size(), 3u);
  msg = error_of([&] { custom.validate_against(config); });
  EXPECT_CONTAINS(msg, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
  EXPECT_CONTAINS(
      msg, "tensor 'model.norm.weight' in model.safetensors has dtype I32, expected a floating-point dtype");
  EXPECT_CONTAINS(msg, "unexpected tensor 'model.extra.weight' in model.safetensors (shape [1])");
}

// ---------------------------------------------------------------- random init (swarm-model init)

TEST_F(SafetensorsTest, InitSmolLM2ShapeIsDeterministicAndValid) {
  REQUIRE_FIXTURE(smollm2());
  // The full 135M model takes seconds; a 2-layer copy of its config covers every code path.
  const fs::path from = tmp_ / "smol-2layers";
  fs::create_directories(from);
  json cfg = json::parse(read_bytes(smollm2() / "config.json"));
  cfg["num_hidden_layers"] = 2;
  std::ofstream(from / "config.json") << cfg.dump(2);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "chat_template.jinja", "generation_config.json"}) {
    fs::copy_file(smollm2() / f, from / f);
  }
  const ModelConfig config = ModelConfig::from_directory(from);

  InitModelOptions opts;
  opts.from = from;
  opts.out = tmp_ / "init-a";
  opts.seed = 7;
  const ModelWriteResult r = init_random_model(opts);
  EXPECT_FALSE(r.sharded);
  EXPECT_EQ(r.tensor_bytes, static_cast<uint64_t>(config.parameter_count()) * 2);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json", "chat_template.jinja", "model.safetensors"}) {
    EXPECT_TRUE(fs::is_regular_file(opts.out / f)) << f;
  }
  EXPECT_EQ(read_bytes(opts.out / "tokenizer.json"), read_bytes(smollm2() / "tokenizer.json"));
  const ModelConfig written = ModelConfig::from_directory(opts.out);
  EXPECT_EQ(written.torch_dtype, "bfloat16");
  EXPECT_EQ(written.parameter_count(), config.parameter_count());

  const SafetensorsModel model = SafetensorsModel::open(opts.out);
  EXPECT_NO_THROW(model.validate_against(config));
  int64_t stored = 0;
  for (const auto& name : model.names()) {
    EXPECT_EQ(model.at(name).dtype, DType::BF16) << name;
    stored += model.at(name).numel();
  }
  EXPECT_EQ(stored, config.parameter_count());
  for (float v : model.at("model.layers.1.input_layernorm.weight").to_f32()) ASSERT_EQ(v, 1.0f);
  const std::vector<float> w = model.at("model.layers.0.mlp.up_proj.weight").to_f32();
  double sum = 0, sq = 0;
  for (float v : w) {
    sum += v;
    sq += double(v) * v;
  }
  const double mean = sum / w.size(), stddev = std::sqrt(sq / w.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(stddev, config.initializer_range, 0.02 * config.initializer_range);

  // Same seed: identical bytes. Another seed: different weights (one tensor is enough).
  InitModelOptions again = opts;
  again.out = tmp_ / "init-b";
  init_random_model(again);
  EXPECT_EQ(read_bytes(again.out / "model.safetensors"), read_bytes(opts.out / "model.safetensors"));
  for (const auto& source : random_init_tensors(config, 8, DType::BF16)) {
    if (source.name != "model.layers.0.mlp.up_proj.weight") continue;
    const TensorView& seven = model.at(source.name);
    std::vector<std::byte> eight(seven.nbytes);
    source.fill(eight);
    EXPECT_NE(std::memcmp(eight.data(), seven.data, seven.nbytes), 0);
  }

  EXPECT_CONTAINS(error_of([&] {
                    InitModelOptions same = opts;
                    same.out = from;
                    init_random_model(same);
                  }),
                  "--out must differ from --from");
}

TEST_F(SafetensorsTest, InitF32FromTinyStoriesConfigAndInspect) {
  REQUIRE_FIXTURE(tinystories());
  InitModelOptions opts;
  opts.from = tinystories();
  opts.out = tmp_ / "ts-random";
  opts.dtype = DType::F32;
  init_random_model(opts);
  expect_python_agrees(opts.out / "model.safetensors");
  // Sharded (tiny limit): the tensors' bytes do not depend on sharding.
  InitModelOptions sharded = opts;
  sharded.out = tmp_ / "ts-sharded";
  sharded.max_shard_bytes = 600'000;
  const ModelWriteResult rs = init_random_model(sharded);
  EXPECT_TRUE(rs.sharded);
  EXPECT_EQ(rs.files.size(), 4u);
  const SafetensorsModel single = SafetensorsModel::open(opts.out);
  const SafetensorsModel split = SafetensorsModel::open(sharded.out);
  EXPECT_NO_THROW(split.validate_against(ModelConfig::from_directory(tinystories())));
  for (const auto& name : single.names()) {
    ASSERT_EQ(std::memcmp(split.at(name).data, single.at(name).data, single.at(name).nbytes), 0) << name;
  }
  for (const auto& f : rs.files) expect_python_agrees(f);

  const json summary = json::parse(inspect_model(opts.out));
  EXPECT_EQ(summary["parameters_from_config"], 656000);
  EXPECT_EQ(summary["parameters_from_tensors"], 656000);
  EXPECT_EQ(summary["tensors_match_config"], true);
  EXPECT_EQ(summary["dtypes"], json({{"F32", 20}}));
  EXPECT_EQ(summary["kv_heads"], 4);

  const json original = json::parse(inspect_model(tinystories()));
  EXPECT_EQ(original["architecture"], "LlamaForCausalLM");
  EXPECT_EQ(original["tie_word_embeddings"], true);
  EXPECT_EQ(original["bytes_on_disk"], 2626168);
  EXPECT_EQ(original["tensors_match_config"], true);
  const json noweights = json::parse(inspect_model(smollm2()));
  EXPECT_EQ(noweights["tensors_match_config"], false);
  EXPECT_EQ(noweights["parameters_from_config"], 134515008);
}

// ---------------------------------------------------------------- dtype conversions

TEST(DTypeConversions, EdgeCases) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);  // above tie
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));  // sNaN stays NaN
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);

  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway to the next binade: rounds to inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie -> even (zero)
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_to_f32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_FALSE(dtype_from_name("F8_E5M2").has_value());
}

TEST_F(SafetensorsTest, ConversionsMatchNumpyAndTorch) {
  std::vector<float> in;
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 100000; ++i)
    in.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));  // any pattern
  for (int i = 0; i < 100000; ++i)
    in.push_back(normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 30));
  for (uint32_t h = 0; h < 0x10000; h += 7) {  // exact f16 / bf16 ties
    in.push_back(std::bit_cast<float>((h << 16) | 0x8000u));
    in.push_back(f16_to_f32(static_cast<uint16_t>(h)) * (1.0f + std::ldexp(1.0f, -11)));
  }
  const fs::path d = tmp_;
  std::ofstream(d / "in_f32.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(in.data()), in.size() * 4);
  const std::string out = python(kReferenceConversions, {d.string()});
  ASSERT_EQ(out.rfind("ok", 0), 0u) << out;

  const std::string f16 = read_bytes(d / "ref_f16.bin"), bf16 = read_bytes(d / "ref_bf16.bin");
  ASSERT_EQ(f16.size(), in.size() * 2);
  ASSERT_EQ(bf16.size(), in.size() * 2);
  size_t f16_bad = 0, bf16_bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t ref_h, ref_b;
    std::memcpy(&ref_h, f16.data() + 2 * i, 2);
    std::memcpy(&ref_b, bf16.data() + 2 * i, 2);
    if (std::isnan(in[i])) {
      f16_bad += !std::isnan(f16_to_f32(f32_to_f16(in[i])));
      bf16_bad += !std::isnan(bf16_to_f32(f32_to_bf16(in[i])));
      continue;
    }
    if (f32_to_f16(in[i]) != ref_h && f16_bad++ < 5) ADD_FAILURE() << "f16 of " << std::hexfloat << in[i];
    if (f32_to_bf16(in[i]) != ref_b && bf16_bad++ < 5) ADD_FAILURE() << "bf16 of " << std::hexfloat << in[i];
  }
  EXPECT_EQ(f16_bad, 0u);
  EXPECT_EQ(bf16_bad, 0u);

  const std::string all = read_bytes(d / "ref_f16_to_f32.bin");
  ASSERT_EQ(all.size(), 65536u * 4);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float ref;
    std::memcpy(&ref, all.data() + 4 * h, 4);
    const float ours = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(ours)) << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(ours), std::bit_cast<uint32_t>(ref)) << h;
    }
  }
}

}  // namespace
}  // namespace swarm
