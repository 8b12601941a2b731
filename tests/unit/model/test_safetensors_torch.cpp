// The libtorch adapter: TinyStories loaded zero-copy, compared tensor by tensor with Python's
// torch + numpy reading the same file (run with /usr/bin/python3).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "model/safetensors.hpp"
#include "model/safetensors_torch.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path tinystories() { return fs::path(SWARM_FIXTURES_DIR) / "models" / "tinystories-656k"; }

// Reads the file with json + numpy, turns each tensor into a torch tensor and reports its
// shape, dtype, float64 sum and sum of squares, plus its raw bytes in OUTDIR/<i>.bin.
constexpr const char* kTorchReference = R"PY(
import json, os, struct, sys
import numpy as np, torch
path, outdir = sys.argv[1], sys.argv[2]
b = open(path, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
header = json.loads(b[8:8 + n])
header.pop('__metadata__', None)
npd = {'F32': np.float32, 'F64': np.float64, 'F16': np.float16, 'I64': np.int64, 'I32': np.int32}
out = {}
for i, (name, info) in enumerate(sorted(header.items())):
    s, e = info['data_offsets']
    arr = np.frombuffer(b[8 + n + s:8 + n + e], dtype=npd[info['dtype']]).reshape(info['shape'])
    t = torch.from_numpy(arr.copy())
    open(os.path.join(outdir, '%d.bin' % i), 'wb').write(t.numpy().tobytes())
    d = t.double()
    out[name] = {'shape': list(t.shape), 'dtype': str(t.dtype), 'sum': d.sum().item(),
                 'sumsq': (d * d).sum().item(), 'file': '%d.bin' % i}
json.dump(out, open(os.path.join(outdir, 'reference.json'), 'w'))
print('ok')
)PY";

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return std::move(out).str();
}

class SafetensorsTorchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_directory(tinystories()))
        << "test fixture missing: " << tinystories() << " (SWARM_FIXTURES_DIR=" SWARM_FIXTURES_DIR ")";
    tmp_ = fs::temp_directory_path() / ("swarm-st-torch-" + std::to_string(::getpid()));
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override { fs::remove_all(tmp_); }
  fs::path tmp_;
};

bool within(const void* p, std::span<const std::byte> range) {
  auto* b = static_cast<const std::byte*>(p);
  return b >= range.data() && b < range.data() + range.size();
}

TEST_F(SafetensorsTorchTest, TinyStoriesMatchesPythonTorchAndIsZeroCopy) {
  ASSERT_TRUE(fs::exists("/usr/bin/python3")) << "needs Debian's python3-torch (scripts/setup.sh)";
  const fs::path file = tinystories() / "model.safetensors";
  const std::string script = (tmp_ / "ref.py").string();
  std::ofstream(script) << kTorchReference;
  const std::string cmd = "/usr/bin/python3 " + script + " " + file.string() + " " + tmp_.string() + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  std::string log;
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) log.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << log;
  const json ref = json::parse(read_bytes(tmp_ / "reference.json"));

  const SafetensorsModel model = SafetensorsModel::open(tinystories());
  const auto mapping = model.files()[0]->bytes();
  const auto state = load_state_dict(model);
  EXPECT_EQ(state.size(), 21u);  // 20 stored + the tied embedding alias
  EXPECT_EQ(ref.size(), 20u);
  for (const auto& [name, r] : ref.items()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(state.count(name));
    const torch::Tensor& t = state.at(name);
    EXPECT_EQ(t.scalar_type(), torch::kFloat);
    EXPECT_EQ(std::vector<int64_t>(t.sizes().begin(), t.sizes().end()),
              r["shape"].get<std::vector<int64_t>>());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_TRUE(within(t.data_ptr(), mapping)) << "not zero-copy: data_ptr outside the mmap";
    const std::string bytes = read_bytes(tmp_ / r["file"].get<std::string>());
    ASSERT_EQ(bytes.size(), static_cast<size_t>(t.nbytes()));
    EXPECT_EQ(std::memcmp(bytes.data(), t.data_ptr(), bytes.size()), 0);
    const torch::Tensor d = t.to(torch::kDouble);
    EXPECT_NEAR(d.sum().item<double>(), r["sum"].get<double>(),
                1e-9 * (1 + std::fabs(r["sum"].get<double>())));
    EXPECT_NEAR((d * d).sum().item<double>(), r["sumsq"].get<double>(), 1e-9 * r["sumsq"].get<double>());
  }
  // Tied weights share storage, like a transformers state_dict.
  EXPECT_EQ(state.at("model.embed_tokens.weight").data_ptr(), state.at("lm_head.weight").data_ptr());
}

TEST_F(SafetensorsTorchTest, TensorsKeepTheMappingAlive) {
  torch::Tensor norm;
  torch::Tensor expected;
  {
    auto state = load_state_dict(tinystories());
    norm = state.at("model.norm.weight");
    expected = norm.clone();
  }  // the model and state dict are gone; the tensor's deleter still holds the file
  EXPECT_TRUE(torch::equal(norm, expected));
  EXPECT_GT(norm.abs().sum().item<float>(), 0.0f);
}

TEST_F(SafetensorsTorchTest, DtypesAndUnalignedData) {
  const std::vector<uint16_t> bf16 = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), f32_to_bf16(0.25f),
                                      f32_to_bf16(8.0f)};
  const std::vector<int64_t> ids = {1, -2, 3};
  const std::vector<uint8_t> flags = {1, 0};
  write_safetensors(tmp_ / "m.safetensors",
                    std::vector<TensorData>{{"w", DType::BF16, {2, 2}, std::as_bytes(std::span(bf16))},
                                            {"ids", DType::I64, {3}, std::as_bytes(std::span(ids))},
                                            {"flags", DType::BOOL, {2}, std::as_bytes(std::span(flags))}});
  const auto state = load_state_dict(tmp_ / "m.safetensors");
  const torch::Tensor w = state.at("w");
  EXPECT_EQ(w.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(w.to(torch::kFloat), torch::tensor({{1.5f, -2.0f}, {0.25f, 8.0f}})));
  EXPECT_EQ(state.at("ids").scalar_type(), torch::kLong);
  EXPECT_EQ(state.at("ids")[1].item<int64_t>(), -2);
  EXPECT_EQ(state.at("flags").scalar_type(), torch::kBool);
  EXPECT_TRUE(state.at("flags")[0].item<bool>());

  // A view that is not aligned to its element size is copied, not aliased.
  alignas(8) std::byte raw[1 + 8] = {};
  const float values[2] = {3.0f, -1.0f};
  std::memcpy(raw + 1, values, 8);
  TensorView view{"u", DType::F32, {2}, raw + 1, 8};
  const torch::Tensor t = to_tensor(view, nullptr);
  EXPECT_NE(t.data_ptr(), static_cast<void*>(raw + 1));
  EXPECT_TRUE(torch::equal(t, torch::tensor({3.0f, -1.0f})));
}

}  // namespace
}  // namespace swarm
