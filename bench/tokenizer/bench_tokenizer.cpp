// Encode throughput of swarm's tokenizer on the three fixture tokenizers (tests/fixtures).
//
//   bench_tokenizer [--fixtures DIR] [--mb N] [--iters N]
//
// The corpus (~2 MB by default) mixes English-heavy prose (70%: the test corpus' English
// texts plus generated sentences whose made-up words defeat the word cache), code (10%),
// CJK and other scripts (10%) and numbers / whitespace / emoji / special tokens (10%), cut into
// documents of 1-4 KB that are encoded one by one, single-threaded, as a server would.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "text/tokenizer.hpp"

namespace {

std::vector<std::string> category(const nlohmann::json& corpus, const char* name) {
  return corpus.at("categories").at(name).get<std::vector<std::string>>();
}

// Pronounceable made-up words: mostly unseen by the BPE word cache.
std::string made_up_sentence(std::mt19937& rng) {
  static const char* kOnsets[] = {"b",  "c", "d", "f", "g", "h", "j",  "k",  "l",  "m",  "n",  "p",
                                  "qu", "r", "s", "t", "v", "w", "st", "tr", "pl", "gr", "sh", "ch"};
  static const char* kVowels[] = {"a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "y"};
  static const char* kCodas[] = {"", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck", "ng"};
  static const char* kCommon[] = {"the", "and", "of",   "to",   "a",   "in", "is", "was", "that", "it",
                                  "he",  "she", "they", "with", "for", "on", "as", "but", "had"};
  std::string s;
  int words = 5 + static_cast<int>(rng() % 15);
  for (int w = 0; w < words; ++w) {
    if (w > 0) s += ' ';
    if (rng() % 2 == 0) {
      s += kCommon[rng() % std::size(kCommon)];
      continue;
    }
    int syllables = 1 + static_cast<int>(rng() % 3);
    std::string word;
    for (int k = 0; k < syllables; ++k) {
      word += kOnsets[rng() % std::size(kOnsets)];
      word += kVowels[rng() % std::size(kVowels)];
      word += kCodas[rng() % std::size(kCodas)];
    }
    if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
    s += word;
  }
  s += ". ";
  return s;
}

std::vector<std::string> build_documents(const nlohmann::json& corpus, size_t target_bytes) {
  std::mt19937 rng(20240601);
  auto english = category(corpus, "english");
  auto code = category(corpus, "code");
  std::vector<std::string> scripts = category(corpus, "cjk");
  for (const auto& s : category(corpus, "mixed_scripts")) scripts.push_back(s);
  for (const auto& s : category(corpus, "accents")) scripts.push_back(s);
  std::vector<std::string> misc;
  for (const char* name : {"numbers", "whitespace", "emoji", "special_tokens", "edge"})
    for (const auto& s : category(corpus, name)) misc.push_back(s);

  std::vector<std::string> docs;
  size_t total = 0;
  while (total < target_bytes) {
    std::string doc;
    size_t size = 1024 + rng() % 3072;
    while (doc.size() < size) {
      unsigned pick = rng() % 100;
      if (pick < 40)
        doc += english[rng() % english.size()] + " ";
      else if (pick < 70)
        doc += made_up_sentence(rng);
      else if (pick < 80)
        doc += code[rng() % code.size()];
      else if (pick < 90)
        doc += scripts[rng() % scripts.size()] + " ";
      else
        doc += misc[rng() % misc.size()];
      if (rng() % 8 == 0) doc += "\n\n";
    }
    total += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string fixtures = SWARM_DEFAULT_FIXTURES_DIR;
  double mb = 2.0;
  int iters = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--fixtures") == 0)
      fixtures = argv[i + 1];
    else if (std::strcmp(argv[i], "--mb") == 0)
      mb = std::atof(argv[i + 1]);
    else if (std::strcmp(argv[i], "--iters") == 0)
      iters = std::atoi(argv[i + 1]);
  }
  std::ifstream in(std::string(SWARM_SOURCE_DIR) + "/tests/data/tokenizer_corpus.json");
  if (!in) {
    std::fprintf(stderr, "cannot read tests/data/tokenizer_corpus.json\n");
    return 1;
  }
  auto corpus = nlohmann::json::parse(in);
  auto docs = build_documents(corpus, static_cast<size_t>(mb * 1024 * 1024));
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();

  struct Entry {
    const char* name;
    const char* dir;
  };
  const Entry entries[] = {{"tinystories-656k (SentencePiece BPE, 2k)", "models/tinystories-656k"},
                           {"smollm2-135m (byte-level BPE, 49k)", "models/smollm2-135m-instruct-noweights"},
                           {"qwen3 (byte-level BPE, 151k, NFC)", "tokenizers/qwen3"}};
  std::printf(
      "corpus: %zu documents, %.2f MB (MB = 1e6 bytes); single thread; cold = first pass (empty "
      "word cache), warm = best of %d more passes\n\n",
      docs.size(), static_cast<double>(bytes) / 1e6, iters);
  std::printf("| %-42s | %8s | %10s | %9s | %9s | %9s |\n", "tokenizer", "load s", "tokens", "bytes/tok",
              "cold MB/s", "warm MB/s");
  std::printf("|%s|%s|%s|%s|%s|%s|\n", std::string(44, '-').c_str(), std::string(10, '-').c_str(),
              std::string(12, '-').c_str(), std::string(11, '-').c_str(), std::string(11, '-').c_str(),
              std::string(11, '-').c_str());
  for (const Entry& e : entries) {
    auto t0 = std::chrono::steady_clock::now();
    auto tok = swarm::Tokenizer::from_directory(fixtures + "/" + e.dir);
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    size_t tokens = 0;
    auto pass = [&] {
      auto start = std::chrono::steady_clock::now();
      size_t n = 0;
      for (const auto& d : docs) n += tok->encode(d, true).size();
      tokens = n;
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    double cold = pass();  // word cache empty at first
    double best = 1e30;
    for (int i = 0; i < iters; ++i) best = std::min(best, pass());
    std::printf("| %-42s | %8.2f | %10zu | %9.2f | %9.2f | %9.2f |\n", e.name, load_s, tokens,
                static_cast<double>(bytes) / static_cast<double>(tokens),
                static_cast<double>(bytes) / 1e6 / cold, static_cast<double>(bytes) / 1e6 / best);
  }
  return 0;
}
