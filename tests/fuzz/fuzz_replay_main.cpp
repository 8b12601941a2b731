// Fallback driver when no libFuzzer-capable clang is available: replays every file given
// (files or directories) and then N deterministic random mutations of them through
// LLVMFuzzerTestOneInput. Usage: fuzz_safetensors_header [-runs=N] [-seed=S] PATH...
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Input = std::vector<uint8_t>;

Input read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Input(std::istreambuf_iterator<char>(in), {});
}

void run(const Input& in) { LLVMFuzzerTestOneInput(in.data(), in.size()); }

// A few libFuzzer-style mutations: byte flips, random bytes, erase, insert, duplicate a
// chunk, splice with another input, patch the 8-byte length, insert a dictionary token.
Input mutate(const Input& base, const std::vector<Input>& corpus, std::mt19937_64& rng) {
  static const char* kTokens[] = {"\"dtype\"",
                                  "\"shape\"",
                                  "\"data_offsets\"",
                                  "\"__metadata__\"",
                                  "\"F32\"",
                                  "\"BF16\"",
                                  "\"I64\"",
                                  "[0,4]",
                                  "{}",
                                  "[]",
                                  "18446744073709551615",
                                  "-1",
                                  "1e308",
                                  "\"\\u0000\"",
                                  "null",
                                  ","};
  Input out = base;
  const int steps = 1 + static_cast<int>(rng() % 4);
  for (int s = 0; s < steps; ++s) {
    const size_t n = out.size();
    switch (rng() % 8) {
      case 0:
        if (n) out[rng() % n] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:
        if (n) out[rng() % n] = static_cast<uint8_t>(rng());
        break;
      case 2:
        if (n) {
          size_t a = rng() % n, len = 1 + rng() % std::min<size_t>(16, n - a);
          out.erase(out.begin() + a, out.begin() + a + len);
        }
        break;
      case 3:
        out.insert(out.begin() + (n ? rng() % (n + 1) : 0), static_cast<uint8_t>(rng()));
        break;
      case 4:
        if (n) {
          size_t a = rng() % n, len = 1 + rng() % std::min<size_t>(32, n - a);
          Input chunk(out.begin() + a, out.begin() + a + len);
          out.insert(out.begin() + rng() % (n + 1), chunk.begin(), chunk.end());
        }
        break;
      case 5: {
        const Input& other = corpus[rng() % corpus.size()];
        size_t cut = n ? rng() % n : 0;
        size_t from = other.empty() ? 0 : rng() % other.size();
        out.resize(cut);
        out.insert(out.end(), other.begin() + from, other.end());
      } break;
      case 6:
        if (n >= 8) {
          uint64_t len;
          std::memcpy(&len, out.data(), 8);
          len = (rng() % 2) ? n - 8 - rng() % 16 : len + (rng() % 64) - 32;
          std::memcpy(out.data(), &len, 8);
        }
        break;
      case 7: {
        const char* t = kTokens[rng() % std::size(kTokens)];
        out.insert(out.begin() + (n ? rng() % (n + 1) : 0), t, t + std::strlen(t));
      } break;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  long runs = 100000;
  uint64_t seed = 1;
  std::vector<Input> corpus;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("-runs=", 0) == 0) {
      runs = std::stol(arg.substr(6));
      continue;
    }
    if (arg.rfind("-seed=", 0) == 0) {
      seed = std::stoull(arg.substr(6));
      continue;
    }
    if (arg[0] == '-') continue;  // libFuzzer flags (-max_total_time=...) are ignored here
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::directory_iterator(arg)) {
        if (e.is_regular_file()) corpus.push_back(read_file(e.path()));
      }
    } else {
      corpus.push_back(read_file(arg));
    }
  }
  if (corpus.empty()) corpus.push_back({});
  for (const auto& in : corpus) run(in);
  std::mt19937_64 rng(seed);
  for (long r = 0; r < runs; ++r) run(mutate(corpus[rng() % corpus.size()], corpus, rng));
  std::printf("replayed %zu corpus inputs and %ld mutations: no crash\n", corpus.size(), runs);
  return 0;
}
