// Tokenizer tests: pinned ids for the three fixture tokenizers (tests/fixtures) (no node needed), the API,
// errors, small hand-written tokenizer.json files for features the fixtures do not use, and
// the parity test against the JS reference (tests/js/tokenize_reference.mjs, @lenml/tokenizers)
// on tests/data/tokenizer_corpus.json plus random strings built from it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "common/error.hpp"
#include "text/tokenizer.hpp"

namespace swarm {
namespace {

using json = nlohmann::json;
using Ids = std::vector<TokenId>;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fixture_path(const std::string& sub) {
  std::string path = std::string(SWARM_FIXTURES_DIR) + "/" + sub;
  if (!std::filesystem::exists(path + "/tokenizer.json"))
    throw std::runtime_error("fixture missing: " + path +
                             "/tokenizer.json (SWARM_FIXTURES_DIR=" + SWARM_FIXTURES_DIR + ")");
  return path;
}

// A Llama-3-style tokenizer (no fixture ships one): Qwen3's vocabulary and merges with
// Llama-3's pre-tokenizer regex, ignore_merges, a Sequence[ByteLevel, TemplateProcessing]
// post-processor adding a bos, and clean_up_tokenization_spaces.
std::string llama3_style_dir() {
  static const std::string dir = [] {
    json t = json::parse(read_file(fixture_path("tokenizers/qwen3") + "/tokenizer.json"));
    t["normalizer"] = nullptr;
    t["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"},
           {"add_prefix_space", false},
           {"trim_offsets", true},
           {"use_regex", false}}}}};
    t["model"]["ignore_merges"] = true;
    t["post_processor"] = {
        {"type", "Sequence"},
        {"processors",
         {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
          {{"type", "TemplateProcessing"},
           {"single",
            {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
           {"pair", json::array()},
           {"special_tokens",
            {{"<|endoftext|>",
              {{"id", "<|endoftext|>"}, {"ids", {151643}}, {"tokens", {"<|endoftext|>"}}}}}}}}}};
    json config = {{"bos_token", "<|endoftext|>"},
                   {"eos_token", "<|im_end|>"},
                   {"clean_up_tokenization_spaces", true},
                   {"tokenizer_class", "PreTrainedTokenizerFast"}};
    auto path =
        std::filesystem::temp_directory_path() / ("swarm_tokenizer_llama3_style_" + std::to_string(getpid()));
    std::filesystem::create_directories(path);
    std::ofstream(path / "tokenizer.json") << t.dump();
    std::ofstream(path / "tokenizer_config.json") << config.dump();
    static struct Cleanup {
      std::filesystem::path p;
      ~Cleanup() { std::filesystem::remove_all(p); }
    } cleanup{path};
    return path.string();
  }();
  return dir;
}

std::string fixture_dir(const std::string& name) {
  if (name == "tinystories") return fixture_path("models/tinystories-656k");
  if (name == "smollm2") return fixture_path("models/smollm2-135m-instruct-noweights");
  if (name == "qwen3") return fixture_path("tokenizers/qwen3");
  if (name == "llama3_style") return llama3_style_dir();
  throw std::runtime_error("unknown fixture " + name);
}

// Loads a tokenizer once per process. A missing fixture fails the test (never skips).
std::shared_ptr<const Tokenizer> fixture(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Tokenizer>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded.find(name); it != loaded.end()) return it->second;
  return loaded[name] = Tokenizer::from_directory(fixture_dir(name));
}

const json& corpus() {
  static const json doc =
      json::parse(read_file(std::string(SWARM_SOURCE_DIR) + "/tests/data/tokenizer_corpus.json"));
  return doc;
}

std::vector<std::string> corpus_texts() {
  std::vector<std::string> texts;
  for (const auto& [name, list] : corpus().at("categories").items())
    for (const auto& t : list) texts.push_back(t.get<std::string>());
  return texts;
}

// Code point boundaries of a UTF-8 string.
std::vector<size_t> char_starts(const std::string& s) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) starts.push_back(i);
  starts.push_back(s.size());
  return starts;
}

// Random strings made of corpus texts and pieces of them (cut anywhere between code points,
// so inside words, emoji sequences and combining sequences), joined by random separators.
std::vector<std::string> random_texts(const std::vector<std::string>& pool, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  static const char* kSeparators[] = {"", " ", "  ", "\n", "\t", " \n", "\n\n"};
  std::vector<std::string> out;
  while (out.size() < n) {
    std::string text;
    size_t parts = 1 + rng() % 5;
    for (size_t p = 0; p < parts; ++p) {
      const std::string& t = pool[rng() % pool.size()];
      auto starts = char_starts(t);
      if (starts.size() > 2 && rng() % 2 == 0) {
        size_t a = rng() % (starts.size() - 1);
        size_t b = a + 1 + rng() % (starts.size() - 1 - a);
        text += t.substr(starts[a], starts[b] - starts[a]);
      } else {
        text += t;
      }
      text += kSeparators[rng() % std::size(kSeparators)];
    }
    out.push_back(std::move(text));
  }
  return out;
}

std::string escape(const std::string& s) { return json(s).dump(); }

std::string show(const Ids& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + "]";
}

// Runs the JS reference on a request; throws (failing the test) with a hint when it is missing.
json run_reference(const json& request) {
  const std::string js_dir = std::string(SWARM_SOURCE_DIR) + "/tests/js";
  if (!std::filesystem::exists(js_dir + "/node_modules/@lenml/tokenizers/package.json"))
    throw std::runtime_error("the JS reference tokenizer is not installed (" + js_dir +
                             "/node_modules is missing): run scripts/setup.sh");
  if (std::system("node --version > /dev/null 2>&1") != 0)
    throw std::runtime_error("node is not on PATH: run scripts/setup.sh");
  static std::atomic<int> counter{0};
  auto base = std::filesystem::temp_directory_path() /
              ("swarm_tokenizer_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  std::string in = base.string() + ".in.json", out = base.string() + ".out.json",
              err = base.string() + ".err.txt";
  std::ofstream(in, std::ios::binary) << request.dump();
  std::string cmd =
      "node '" + js_dir + "/tokenize_reference.mjs' < '" + in + "' > '" + out + "' 2> '" + err + "'";
  int rc = std::system(cmd.c_str());
  std::string output = read_file(out), errors = read_file(err);
  std::filesystem::remove(in);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  if (rc != 0) throw std::runtime_error("JS reference failed (rc " + std::to_string(rc) + "): " + errors);
  return json::parse(output);
}

std::string decode_incrementally(const Tokenizer& tok, const Ids& ids, bool skip_special) {
  auto dec = tok.incremental_decoder(skip_special);
  std::string text;
  for (TokenId id : ids) {
    std::string piece = dec.push(id);
    // Never ends inside a UTF-8 character.
    size_t n = piece.size(), k = 0;
    while (k < n && k < 4 && (static_cast<unsigned char>(piece[n - 1 - k]) & 0xC0) == 0x80) ++k;
    if (k < n) {
      auto lead = static_cast<unsigned char>(piece[n - 1 - k]);
      size_t need = lead < 0x80 ? 0 : lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : k;
      EXPECT_GE(k, need) << "push() ended inside a character: " << escape(piece);
    }
    text += piece;
  }
  return text + dec.flush();
}

// ------------------------------------------------------------------ pinned ids (no node)

struct Pinned {
  const char* fixture;
  const char* text;
  Ids ids;  // with add_special_tokens = true, taken from the JS reference
};

const std::vector<Pinned>& pinned() {
  static const std::vector<Pinned> cases = {
      {"tinystories",
       "Once upon a time, there was a little girl named Lily.",
       {1, 80, 147, 201, 282, 215, 286, 598, 629, 10}},
      {"tinystories",
       "<|im_start|>user\nhi<|im_end|>",
       {1, 211, 110, 52, 166, 210, 823, 91, 3, 60, 61, 208, 110, 52, 183, 210}},
      {"tinystories", "你好，世界！ 👍🏽", {1, 0, 80, 0}},
      {"tinystories",
       "def f(x):\n    return x ** 2  # 1234567",
       {1,   80,   781, 511, 58, 0,  76, 0, 21, 3,  80, 80, 80, 80, 123, 620,
        754, 1841, 0,   80,  13, 80, 80, 0, 80, 12, 13, 14, 15, 16, 17,  18}},
      {"tinystories", "cafe\xcc\x81 Zu\xcc\x88rich", {1, 80, 295, 255, 0, 80, 51, 73, 0, 132, 191}},
      {"tinystories", "<|start_story|>Once upon", {1, 1, 147, 201, 189, 111}},
      {"smollm2",
       "Once upon a time, there was a little girl named Lily.",
       {6403, 1980, 253, 655, 28, 665, 436, 253, 1838, 8180, 3365, 14176, 30}},
      {"smollm2", "<|im_start|>user\nhi<|im_end|>", {1, 4093, 198, 6004, 2}},
      {"smollm2",
       "你好，世界！ 👍🏽",
       {18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230, 8083, 219, 15107, 235, 231, 10813, 233,
        138}},
      {"smollm2",
       "def f(x):\n    return x ** 2  # 1234567",
       {1604, 275, 24, 104, 727, 472, 1003, 1792, 1903, 216, 34, 216, 907, 216, 33, 34, 35, 36, 37, 38, 39}},
      {"smollm2", "cafe\xcc\x81 Zu\xcc\x88rich", {83, 9980, 151, 219, 1777, 101, 151, 226, 5130}},
      {"qwen3",
       "Once upon a time, there was a little girl named Lily.",
       {12522, 5193, 264, 882, 11, 1052, 572, 264, 2632, 3743, 6941, 47290, 13}},
      {"qwen3", "<|im_start|>user\nhi<|im_end|>", {151644, 872, 198, 6023, 151645}},
      {"qwen3", "你好，世界！ 👍🏽", {108386, 3837, 99489, 6313, 61804, 235, 145375}},
      {"qwen3",
       "def f(x):\n    return x ** 2  # 1234567",
       {750, 282, 2075, 982, 262, 470, 856, 3070, 220, 17, 220, 671, 220, 16, 17, 18, 19, 20, 21, 22}},
      {"qwen3", "cafe\xcc\x81 Zu\xcc\x88rich", {924, 58858, 1863, 5186, 713}},
  };
  return cases;
}

TEST(Tokenizer, PinnedIdsFromTheReference) {
  for (const Pinned& p : pinned()) {
    auto tok = fixture(p.fixture);
    EXPECT_EQ(show(tok->encode(p.text)), show(p.ids)) << p.fixture << " " << escape(p.text);
  }
}

TEST(Tokenizer, SpecialTokensAndVocabulary) {
  auto ts = fixture("tinystories");
  EXPECT_EQ(ts->vocab_size(), 2048);
  EXPECT_EQ(ts->bos_id(), 1);
  EXPECT_EQ(ts->eos_id(), 2);
  EXPECT_EQ(ts->pad_id(), 0);
  EXPECT_EQ(ts->bos_token(), "<|start_story|>");
  EXPECT_TRUE(ts->is_special(2));
  EXPECT_FALSE(ts->is_special(80));
  EXPECT_EQ(ts->encode("Hello", false).front(), 80);  // "▁" + ...
  EXPECT_EQ(ts->token_string(80), "\xE2\x96\x81");
  EXPECT_EQ(ts->token_bytes(80), " ");

  auto qwen = fixture("qwen3");
  EXPECT_EQ(qwen->vocab_size(), 151669);
  EXPECT_FALSE(qwen->bos_id().has_value());
  EXPECT_EQ(qwen->bos_token(), "");
  EXPECT_EQ(qwen->eos_id(), 151645);
  EXPECT_EQ(qwen->eos_token(), "<|im_end|>");
  EXPECT_EQ(qwen->pad_id(), 151643);
  EXPECT_EQ(qwen->token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(qwen->token_to_id("<think>"), 151667);
  EXPECT_TRUE(qwen->is_special(151644));
  EXPECT_FALSE(qwen->is_special(151667));  // <think> is added but not special
  EXPECT_EQ(qwen->token_string(9707), "Hello");
  EXPECT_EQ(qwen->token_string(220), "\xC4\xA0");  // "Ġ"
  EXPECT_EQ(qwen->token_bytes(220), " ");
  EXPECT_EQ(qwen->token_bytes(151645), "<|im_end|>");
  EXPECT_EQ(qwen->token_to_id("\xC4\xA0"), 220);
  EXPECT_FALSE(qwen->token_to_id("no such token").has_value());
  EXPECT_THROW(qwen->token_string(151669), SwarmError);
  EXPECT_THROW(qwen->token_string(-1), SwarmError);
  // <think> survives skip_special_tokens, <|im_end|> does not.
  EXPECT_EQ(qwen->decode(qwen->encode("<think>x</think><|im_end|>"), true), "<think>x</think>");
  EXPECT_EQ(qwen->decode(qwen->encode("<think>x</think><|im_end|>"), false), "<think>x</think><|im_end|>");
  // Ids past the tokenizer (a model's padded embedding rows) decode to nothing, like HF.
  EXPECT_EQ(qwen->decode({9707, 151900, 1879}), "Hello world");

  auto smol = fixture("smollm2");
  EXPECT_EQ(smol->vocab_size(), 49152);
  EXPECT_EQ(smol->bos_id(), 1);
  EXPECT_EQ(smol->eos_id(), 2);
  EXPECT_EQ(smol->encode("a", true), Ids({81}));  // no post-processor: nothing added
}

TEST(Tokenizer, NfcBeforeQwenPreTokenization) {
  auto qwen = fixture("qwen3");
  EXPECT_EQ(qwen->encode("caf\xC3\xA9"), qwen->encode("cafe\xCC\x81"));
  EXPECT_EQ(qwen->encode("\xEA\xB0\x81"),
            qwen->encode("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"));    // 각
  EXPECT_EQ(qwen->encode("\xC3\x85"), qwen->encode("\xE2\x84\xAB"));  // Å = Angstrom sign
  EXPECT_EQ(qwen->decode(qwen->encode("cafe\xCC\x81")), "caf\xC3\xA9");
}

TEST(Tokenizer, InvalidUtf8InputIsReadAsReplacementCharacters) {
  auto qwen = fixture("qwen3");
  EXPECT_EQ(qwen->encode("a\xFF"
                         "b"),
            qwen->encode("a\xEF\xBF\xBD"
                         "b"));
  EXPECT_EQ(qwen->encode("a\xE4\xBD"), qwen->encode("a\xEF\xBF\xBD"));
}

TEST(Tokenizer, IncrementalDecoderHoldsBackPartialCharacters) {
  auto qwen = fixture("qwen3");
  Ids ids = qwen->encode("I love pizza \xF0\x9F\x8D\x95 and \xE4\xBD\xA0\xE5\xA5\xBD", false);
  auto dec = qwen->incremental_decoder();
  std::string text;
  for (TokenId id : ids) text += dec.push(id);
  text += dec.flush();
  EXPECT_EQ(text, "I love pizza \xF0\x9F\x8D\x95 and \xE4\xBD\xA0\xE5\xA5\xBD");
  // A byte that never completes comes out as U+FFFD at flush, as decode() does.
  auto half = qwen->token_to_id("\xC3\xA4");  // byte 0xE4
  ASSERT_TRUE(half.has_value());
  auto dec2 = qwen->incremental_decoder();
  EXPECT_EQ(dec2.push(*half), "");
  EXPECT_EQ(dec2.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(qwen->decode({*half}), "\xEF\xBF\xBD");
}

TEST(Tokenizer, EncodeIsThreadSafe) {
  auto qwen = fixture("qwen3");
  auto texts = random_texts(corpus_texts(), 200, 99);
  std::vector<Ids> expected;
  for (const auto& t : texts) expected.push_back(qwen->encode(t));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t round = 0; round < 3; ++round)
        for (size_t i = t; i < texts.size() + t; ++i)
          if (qwen->encode(texts[i % texts.size()]) != expected[i % texts.size()]) ++mismatches;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// ------------------------------------------------------------------ errors

void expect_invalid(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected SwarmError containing " << needle;
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

json tiny_model(json vocab, json merges) {
  return {
      {"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}, {"unk_token", nullptr}};
}

json tiny_tokenizer() {
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Fuse"}}},
          {"model", tiny_model({{"a", 0}, {"b", 1}, {"-", 2}, {" ", 3}, {"ab", 4}}, json::array({"a b"}))}};
}

// Model files are bounded like request bodies (common/json_nesting.hpp): a tokenizer.json or
// tokenizer_config.json nested past 128 levels is refused before it is parsed.
TEST(TokenizerErrors, DeepNestingIsRefusedNamingTheFile) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string text = tiny_tokenizer().dump();
  text.insert(text.size() - 1, ", \"extra\": " + deep);
  expect_invalid([&] { Tokenizer::from_json(text); }, "tokenizer.json is nested deeper than 128 levels");
  expect_invalid([&] { Tokenizer::from_json(tiny_tokenizer().dump(), "{\"x\": " + deep + "}"); },
                 "tokenizer_config.json is nested deeper than 128 levels");
}

TEST(TokenizerErrors, NameTheFileAndWhatIsUnsupported) {
  json t = tiny_tokenizer();
  t["normalizer"] = {{"type", "NFKC"}};
  expect_invalid([&] { Tokenizer::from_json(t.dump()); }, "tokenizer.json: unsupported normalizer \"NFKC\"");
  t = tiny_tokenizer();
  t["model"]["type"] = "Unigram";
  expect_invalid([&] { Tokenizer::from_json(t.dump()); }, "unsupported model \"Unigram\"");
  t = tiny_tokenizer();
  t["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  expect_invalid([&] { Tokenizer::from_json(t.dump()); }, "unsupported pre_tokenizer \"BertPreTokenizer\"");
  t = tiny_tokenizer();
  t["decoder"] = {{"type", "WordPiece"}};
  expect_invalid([&] { Tokenizer::from_json(t.dump()); }, "unsupported decoder \"WordPiece\"");
  t = tiny_tokenizer();
  t["model"]["merges"] = json::array({"a c"});
  expect_invalid([&] { Tokenizer::from_json(t.dump()); }, "not in the vocabulary");
  // A huge id (found by fuzz_tokenizer_json: the id table asked for 17 GB) is refused, in the
  // vocabulary and in added_tokens alike.
  t = tiny_tokenizer();
  t["model"]["vocab"]["ab"] = 2000000000;
  expect_invalid([&] { Tokenizer::from_json(t.dump()); }, "too large");
  t = tiny_tokenizer();
  t["added_tokens"] = json::array({{{"id", 5000000}, {"content", "<x>"}, {"special", true}}});
  expect_invalid([&] { Tokenizer::from_json(t.dump()); }, "too large");
  expect_invalid([&] { Tokenizer::from_json("{not json"); }, "tokenizer.json: malformed JSON");
  expect_invalid([&] { Tokenizer::from_json(tiny_tokenizer().dump(), "[1]"); }, "tokenizer_config.json");
  expect_invalid([&] { Tokenizer::from_json(tiny_tokenizer().dump(), R"({"bos_token": 5})"); },
                 "tokenizer_config.json: \"bos_token\"");
  expect_invalid([&] { Tokenizer::from_directory("/nonexistent/dir"); }, "/nonexistent/dir/tokenizer.json");
}

// ------------------------------------------------------------------ features the fixtures lack

Ids encode_with(const json& t, const std::string& text, const json& config = json::object()) {
  return Tokenizer::from_json(t.dump(), config.dump())->encode(text);
}

TEST(TokenizerFeatures, SplitBehaviors) {
  json t = tiny_tokenizer();
  t["model"] = tiny_model({{"a", 0}, {"b", 1}, {"-", 2}, {"a-", 3}, {"-b", 4}, {"--", 5}},
                          json::array({"a -", "- b", "- -"}));
  auto with = [&](const char* behavior) {
    t["pre_tokenizer"] = {
        {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
    return encode_with(t, "a-b--a");
  };
  EXPECT_EQ(with("Isolated"), Ids({0, 2, 1, 2, 2, 0}));
  EXPECT_EQ(with("Removed"), Ids({0, 1, 0}));
  EXPECT_EQ(with("MergedWithPrevious"), Ids({3, 1, 2, 2, 0}));  // a- | b- | - | a
  EXPECT_EQ(with("MergedWithNext"), Ids({0, 4, 2, 2, 0}));      // a | -b | - | -a
  EXPECT_EQ(with("Contiguous"), Ids({0, 2, 1, 5, 0}));          // a | - | b | -- | a
  t["pre_tokenizer"] = nullptr;
  EXPECT_EQ(encode_with(t, "a-b--a"), Ids({3, 1, 5, 0}));  // one word: "a -" first, then "- -"
}

TEST(TokenizerFeatures, AddedTokenStripAndSingleWord) {
  json t = tiny_tokenizer();
  t["model"] = tiny_model({{"a", 0}, {"b", 1}, {" ", 2}}, json::array());
  t["added_tokens"] = json::array({{{"id", 3},
                                    {"content", "<m>"},
                                    {"lstrip", true},
                                    {"rstrip", true},
                                    {"single_word", false},
                                    {"normalized", false},
                                    {"special", true}},
                                   {{"id", 4},
                                    {"content", "ab"},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"single_word", true},
                                    {"normalized", false},
                                    {"special", false}}});
  EXPECT_EQ(encode_with(t, "a <m>  b"), Ids({0, 3, 1}));               // spaces around <m> are eaten
  EXPECT_EQ(encode_with(t, "ab bab ab"), Ids({4, 2, 1, 0, 1, 2, 4}));  // "ab" inside "bab" is not a word
  auto tok = Tokenizer::from_json(t.dump());
  EXPECT_EQ(tok->decode({0, 3, 1}, true), "ab");
  EXPECT_EQ(tok->decode({0, 3, 1}, false), "a<m>b");
}

TEST(TokenizerFeatures, NormalizedAddedTokensMatchTheNormalizedText) {
  json t = tiny_tokenizer();
  t["model"] = tiny_model({{"a", 0}, {"b", 1}, {"x", 2}}, json::array());
  t["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", "b"}}}, {"content", "a"}};
  t["added_tokens"] = json::array({{{"id", 3},
                                    {"content", "ab"},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"single_word", false},
                                    {"normalized", true},
                                    {"special", false}}});
  // "ab" normalizes to "aa": it matches where the normalized text has "aa".
  EXPECT_EQ(encode_with(t, "xbbx"), Ids({2, 3, 2}));
  EXPECT_EQ(encode_with(t, "xabx"), Ids({2, 3, 2}));
}

TEST(TokenizerFeatures, MetaspacePreTokenizerAndDecoder) {
  const std::string sp = "\xE2\x96\x81";
  json t = tiny_tokenizer();
  t["model"] = tiny_model({{sp, 0}, {"a", 1}, {"b", 2}, {sp + "a", 3}, {sp + "b", 4}},
                          json::array({sp + " a", sp + " b"}));
  t["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", "always"}, {"split", true}};
  t["decoder"] = {{"type", "Metaspace"}, {"replacement", sp}, {"prepend_scheme", "always"}, {"split", true}};
  t["added_tokens"] = json::array({{{"id", 5},
                                    {"content", "<s>"},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"single_word", false},
                                    {"normalized", false},
                                    {"special", true}}});
  EXPECT_EQ(encode_with(t, "a b"), Ids({3, 4}));
  EXPECT_EQ(encode_with(t, "<s>a b"), Ids({5, 3, 4}));  // "always": every section gets "▁"
  t["pre_tokenizer"]["prepend_scheme"] = "first";
  EXPECT_EQ(encode_with(t, "<s>a b"), Ids({5, 1, 4}));  // only the text's start does
  EXPECT_EQ(encode_with(t, "a<s>a"), Ids({3, 5, 1}));
  auto tok = Tokenizer::from_json(t.dump());
  EXPECT_EQ(tok->decode({3, 4}), "a b");
  EXPECT_EQ(tok->decode({4, 3}, false), "b a");
}

TEST(TokenizerFeatures, PostProcessorAndConfigSpecialTokens) {
  json t = tiny_tokenizer();
  t["added_tokens"] = json::array({{{"id", 5},
                                    {"content", "<s>"},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"single_word", false},
                                    {"normalized", false},
                                    {"special", true}},
                                   {{"id", 6},
                                    {"content", "</s>"},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"single_word", false},
                                    {"normalized", false},
                                    {"special", true}}});
  json config = {{"bos_token", {{"content", "<s>"}, {"__type", "AddedToken"}}},
                 {"eos_token", "</s>"},
                 {"add_bos_token", true},
                 {"add_eos_token", true}};
  auto tok = Tokenizer::from_json(t.dump(), config.dump());
  EXPECT_EQ(tok->encode("ab"), Ids({5, 4, 6}));
  EXPECT_EQ(tok->encode("ab", false), Ids({4}));
  EXPECT_EQ(tok->bos_id(), 5);
  EXPECT_EQ(tok->eos_id(), 6);
  // A TemplateProcessing in tokenizer.json is what counts then.
  t["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
      {"special_tokens", {{"</s>", {{"id", "</s>"}, {"ids", {6}}, {"tokens", {"</s>"}}}}}}};
  EXPECT_EQ(Tokenizer::from_json(t.dump(), config.dump())->encode("ab"), Ids({4, 6}));
}

// transformers' LlamaTokenizerFast (and the other classes listed in src/text/tokenizer.cpp's
// rebuilding_class) replaces tokenizer.json's post-processor by a TemplateProcessing built from
// add_bos_token / add_eos_token (class defaults true / false) when it is made; every other class
// keeps the file's post-processor. The JS reference ignores both flags, so the expected ids are
// that rule applied to the ids without special tokens (themselves checked against the reference).
TEST(TokenizerFeatures, ConfigFlagsRebuildThePostProcessorOfLlamaLikeClasses) {
  const std::string dir = fixture_path("models/tinystories-656k");
  const std::string file = read_file(dir + "/tokenizer.json");
  const json config = json::parse(read_file(dir + "/tokenizer_config.json"));
  const json tj = json::parse(file);
  ASSERT_EQ(tj["post_processor"]["type"], "TemplateProcessing");  // the file adds <|start_story|>
  ASSERT_EQ(config["tokenizer_class"], "LlamaTokenizer");
  const std::string text = "Once upon a time";
  const Ids plain = Tokenizer::from_json(file, config.dump())->encode(text, false);
  ASSERT_FALSE(plain.empty());
  const TokenId bos = 1, eos = 2;  // <|start_story|>, <|end_story|>
  const auto with = [&](std::initializer_list<TokenId> before, std::initializer_list<TokenId> after) {
    Ids ids(before);
    ids.insert(ids.end(), plain.begin(), plain.end());
    ids.insert(ids.end(), after);
    return ids;
  };
  const auto encode = [&](const json& cfg, const std::string& tokenizer_json) {
    return Tokenizer::from_json(tokenizer_json, cfg.dump())->encode(text);
  };

  EXPECT_EQ(encode(config, file), with({bos}, {}));  // add_bos_token: true, as the file does
  json c = config;
  c["add_bos_token"] = false;
  EXPECT_EQ(encode(c, file), with({}, {}));  // the file's BOS is dropped
  c["add_eos_token"] = true;
  EXPECT_EQ(encode(c, file), with({}, {eos}));
  c["add_bos_token"] = true;
  EXPECT_EQ(encode(c, file), with({bos}, {eos}));
  c["tokenizer_class"] = "LlamaTokenizerFast";  // the same class
  EXPECT_EQ(encode(c, file), with({bos}, {eos}));
  c["add_bos_token"] = nullptr;  // Python passes None: no BOS
  EXPECT_EQ(encode(c, file), with({}, {eos}));

  // Flags absent: the class defaults (BOS, no EOS), even where the file adds both.
  json both = tj;
  both["post_processor"]["single"].push_back({{"SpecialToken", {{"id", "<|end_story|>"}, {"type_id", 0}}}});
  both["post_processor"]["special_tokens"]["<|end_story|>"] = {
      {"id", "<|end_story|>"}, {"ids", {eos}}, {"tokens", {"<|end_story|>"}}};
  json absent = config;
  absent.erase("add_bos_token");
  absent.erase("add_eos_token");
  EXPECT_EQ(encode(absent, both.dump()), with({bos}, {}));
  // A post-processor that adds nothing (ByteLevel; e.g. a Qwen vocabulary under LlamaTokenizerFast)
  // gets the BOS too.
  json none = tj;
  none["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}};
  EXPECT_EQ(encode(absent, none.dump()), with({bos}, {}));
  // GPTNeoXTokenizerFast defaults to neither.
  absent["tokenizer_class"] = "GPTNeoXTokenizerFast";
  EXPECT_EQ(encode(absent, both.dump()), with({}, {}));

  // Other classes keep the file's post-processor, whatever the flags say.
  for (const char* cls : {"PreTrainedTokenizerFast", "Qwen2Tokenizer", "GPT2TokenizerFast"}) {
    c = config;
    c["tokenizer_class"] = cls;
    c["add_bos_token"] = false;
    c["add_eos_token"] = true;
    Ids want = Tokenizer::from_json(file, c.dump())->encode(text, false);  // legacy SentencePiece now
    want.insert(want.begin(), bos);
    EXPECT_EQ(encode(c, file), want) << cls;
    want.push_back(eos);
    EXPECT_EQ(encode(c, both.dump()), want) << cls;
  }
  // A rebuilding class with a flag set and no such token is an error naming it.
  c = config;
  c["add_eos_token"] = true;
  c["eos_token"] = "<not-a-token>";
  try {
    encode(c, file);
    ADD_FAILURE() << "expected an error";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("add_eos_token"), std::string::npos) << e.what();
  }
}

TEST(TokenizerFeatures, IgnoreMergesByteFallbackAndFuseUnk) {
  json t = tiny_tokenizer();
  t["model"] =
      tiny_model({{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}, {"<unk>", 5}}, json::array({"a b"}));
  EXPECT_EQ(encode_with(t, "abc"), Ids({3, 2}));
  t["model"]["ignore_merges"] = true;
  EXPECT_EQ(encode_with(t, "abc"), Ids({4}));
  t["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(encode_with(t, "axyb"), Ids({0, 5, 5, 1}));
  t["model"]["fuse_unk"] = true;
  EXPECT_EQ(encode_with(t, "axyb"), Ids({0, 5, 1}));

  json bf = tiny_tokenizer();
  bf["model"] = tiny_model({{"a", 0}, {"<0xC3>", 1}, {"<0xA9>", 2}, {"<unk>", 3}}, json::array());
  bf["model"]["byte_fallback"] = true;
  bf["model"]["unk_token"] = "<unk>";
  bf["decoder"] = {{"type", "Sequence"},
                   {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}};
  auto tok = Tokenizer::from_json(bf.dump());
  EXPECT_EQ(tok->encode("a\xC3\xA9"), Ids({0, 1, 2}));
  EXPECT_EQ(tok->encode("\xC3\xA8"), Ids({3}));  // 0xA8 has no byte token: <unk>
  EXPECT_EQ(tok->decode({1, 2, 0}),
            "\xC3\xA9"
            "a");
  EXPECT_EQ(tok->decode({2, 1, 0}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "a");  // HF: one U+FFFD per byte
  EXPECT_EQ(decode_incrementally(*tok, {1, 2, 0, 1}, true), tok->decode({1, 2, 0, 1}));
}

TEST(TokenizerFeatures, CleanUpTokenizationSpaces) {
  json t = tiny_tokenizer();
  t["model"] =
      tiny_model({{"a", 0}, {" ", 1}, {".", 2}, {"'", 3}, {"s", 4}, {"n", 5}, {"t", 6}}, json::array());
  auto tok = Tokenizer::from_json(t.dump(), R"({"clean_up_tokenization_spaces": true})");
  Ids ids = tok->encode("a . a 's a n't a ' a .");
  EXPECT_EQ(tok->decode(ids), "a. a's an't a'a.");
  for (size_t n = 0; n <= ids.size(); ++n) {
    Ids prefix(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(decode_incrementally(*tok, prefix, true), tok->decode(prefix));
  }
  EXPECT_EQ(Tokenizer::from_json(t.dump())->decode(ids), "a . a 's a n't a ' a .");
}

// ------------------------------------------------------------------ parity with the JS reference

class TokenizerParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerParity, IdsAndTextMatchTheJsReference) {
  const std::string name = GetParam();
  auto tok = fixture(name);
  std::vector<std::string> texts = corpus_texts();
  const size_t fixed = texts.size();
  auto random = random_texts(texts, 400, 20240601);
  texts.insert(texts.end(), random.begin(), random.end());

  size_t id_mismatches = 0, decode_mismatches = 0, roundtrip_failures = 0, stream_failures = 0,
         roundtrips = 0;
  for (bool add_special : {true, false}) {
    json ref = run_reference(
        {{"tokenizer_dir", fixture_dir(name)}, {"texts", texts}, {"add_special_tokens", add_special}});
    ASSERT_EQ(ref.at("ids").size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      Ids expected = ref["ids"][i].get<Ids>();
      Ids actual = tok->encode(texts[i], add_special);
      if (actual != expected && ++id_mismatches <= 5)
        ADD_FAILURE() << name << " add_special_tokens=" << add_special << " " << escape(texts[i])
                      << "\n  reference " << show(expected) << "\n  swarm     " << show(actual);
      for (bool skip : {true, false}) {
        std::string want = ref[skip ? "decoded" : "decoded_with_special"][i].get<std::string>();
        std::string got = tok->decode(expected, skip);
        if (got != want && ++decode_mismatches <= 5)
          ADD_FAILURE() << name << " decode(skip_special_tokens=" << skip << ") of " << show(expected)
                        << "\n  reference " << escape(want) << "\n  swarm     " << escape(got);
        if (decode_incrementally(*tok, expected, skip) != got && ++stream_failures <= 5)
          ADD_FAILURE() << name << " incremental decode differs for " << escape(texts[i]);
      }
    }
  }

  // decode(encode(x)) == x wherever HF round-trips: byte-level always (Qwen3 up to NFC), the
  // SentencePiece one when nothing became <unk> and the text has no literal "▁"; not with
  // clean_up_tokenization_spaces (llama3_style).
  json nfc = run_reference({{"tokenizer_dir", fixture_dir(name)}, {"texts", json::array()}, {"nfc", texts}});
  for (size_t i = 0; i < texts.size() && name != "llama3_style"; ++i) {
    Ids ids = tok->encode(texts[i], false);
    std::string expected = texts[i];
    if (name == "qwen3") expected = nfc.at("nfc")[i].get<std::string>();
    if (name == "tinystories" && (std::find(ids.begin(), ids.end(), 0) != ids.end() ||
                                  texts[i].find("\xE2\x96\x81") != std::string::npos))
      continue;
    ++roundtrips;
    if (tok->decode(ids, false) != expected && ++roundtrip_failures <= 5)
      ADD_FAILURE() << name << " round trip: " << escape(texts[i]) << " -> "
                    << escape(tok->decode(ids, false));
  }
  EXPECT_EQ(id_mismatches, 0u);
  EXPECT_EQ(decode_mismatches, 0u);
  EXPECT_EQ(stream_failures, 0u);
  EXPECT_EQ(roundtrip_failures, 0u);
  std::printf(
      "[parity] %s: %zu texts (%zu corpus + %zu random) x add_special_tokens {true,false}: %zu id "
      "mismatches, "
      "%zu decode mismatches; %zu round trips checked, %zu failed\n",
      name.c_str(), texts.size(), fixed, texts.size() - fixed, id_mismatches, decode_mismatches, roundtrips,
      roundtrip_failures);
}

TEST_P(TokenizerParity, DecodingRandomIdsMatchesTheJsReference) {
  const std::string name = GetParam();
  auto tok = fixture(name);
  // Mostly single-byte tokens (to cut UTF-8 sequences anywhere), some random and special ids.
  Ids bytes, specials;
  for (TokenId id = 0; id < tok->vocab_size(); ++id) {
    if (tok->token_string(id).empty()) continue;
    if (tok->is_special(id)) specials.push_back(id);
    std::string b = tok->token_bytes(id);
    if (b.size() == 1 || (b.size() == 6 && b.rfind("<0x", 0) == 0)) bytes.push_back(id);
  }
  std::mt19937 rng(7);
  std::vector<Ids> lists;
  for (int n = 0; n < 300; ++n) {
    Ids ids;
    size_t len = 1 + rng() % 12;
    for (size_t k = 0; k < len; ++k) {
      unsigned pick = rng() % 10;
      if (pick < 5 && !bytes.empty())
        ids.push_back(bytes[rng() % bytes.size()]);
      else if (pick < 6 && !specials.empty())
        ids.push_back(specials[rng() % specials.size()]);
      else
        ids.push_back(static_cast<TokenId>(rng() % static_cast<uint32_t>(tok->vocab_size())));
    }
    lists.push_back(std::move(ids));
  }
  json ref =
      run_reference({{"tokenizer_dir", fixture_dir(name)}, {"texts", json::array()}, {"decode", lists}});
  size_t mismatches = 0;
  for (size_t i = 0; i < lists.size(); ++i) {
    for (bool skip : {true, false}) {
      std::string want = ref.at("decode_results")[i][skip ? "skip" : "keep"].get<std::string>();
      std::string got = tok->decode(lists[i], skip);
      if (got != want && ++mismatches <= 5)
        ADD_FAILURE() << name << " decode(" << show(lists[i]) << ", skip=" << skip << ")\n  reference "
                      << escape(want) << "\n  swarm     " << escape(got);
      EXPECT_EQ(decode_incrementally(*tok, lists[i], skip), got);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(SharedTokenizers, TokenizerParity,
                         ::testing::Values("tinystories", "smollm2", "qwen3", "llama3_style"),
                         [](const auto& info) { return info.param; });

// Where the JS reference knowingly departs from HF tokenizers, swarm follows HF: its ids equal
// the reference's ids of the pre-tokens HF produces, encoded one by one.
TEST(TokenizerParityDivergences, FollowHuggingFaceWhereTheReferenceDiffers) {
  for (const json& c : corpus().at("known_divergences").at("cases")) {
    std::string name = c.at("tokenizer");
    auto tok = fixture(name);
    json ref = run_reference(
        {{"tokenizer_dir", fixture_dir(name)}, {"texts", c.at("pieces")}, {"add_special_tokens", false}});
    Ids expected;
    for (const auto& ids : ref.at("ids")) {
      Ids piece = ids.get<Ids>();
      expected.insert(expected.end(), piece.begin(), piece.end());
    }
    std::string text = c.at("text");
    EXPECT_EQ(show(tok->encode(text, false)), show(expected))
        << name << " " << escape(text) << ": " << c.at("reason");
  }
}

}  // namespace
}  // namespace swarm
