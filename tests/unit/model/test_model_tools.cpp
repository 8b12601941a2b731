// swarm-model's library (src/model/model_tools): the `init --preset tiny-char` model — a
// loadable Llama directory whose character-level tokenizer round-trips every printable ASCII
// character, matches the JS reference tokenizer (tests/js, @lenml/tokenizers) id for id, and
// whose chat template renders as Python's jinja2 does (tests/reference/render_chat_template.py).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "model/model_config.hpp"
#include "model/model_tools.hpp"
#include "support/scratch_dir.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

namespace swarm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using testing::ScratchDir;

const std::string kSource = SWARM_SOURCE_DIR;

fs::path init_tiny_char(const fs::path& out, uint64_t seed = 1, DType dtype = DType::F32) {
  InitModelOptions o;
  o.preset = "tiny-char";
  o.out = out;
  o.seed = seed;
  o.dtype = dtype;
  init_random_model(o);
  return out;
}

// Every character the preset promises to encode as one token.
std::string ascii_alphabet() {
  std::string s = "\t\n";
  for (int c = 0x20; c <= 0x7E; ++c) s += static_cast<char>(c);
  return s;
}

TEST(TinyCharPreset, IsAListedPreset) {
  const auto& names = model_preset_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "tiny-char"), names.end());
}

TEST(TinyCharPreset, WritesALoadableSmallLlama) {
  ScratchDir dir("swarm-preset");
  const fs::path out = init_tiny_char(dir.path() / "m");
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "model.safetensors"})
    EXPECT_TRUE(fs::is_regular_file(out / f)) << f;

  const ModelConfig c = ModelConfig::from_directory(out);
  EXPECT_EQ(c.architecture, Architecture::LLAMA);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_GE(c.parameter_count(), 1'000'000);
  EXPECT_LE(c.parameter_count(), 3'000'000);

  const auto tok = Tokenizer::from_directory(out.string());
  EXPECT_EQ(tok->vocab_size(), c.vocab_size);
  ASSERT_TRUE(tok->eos_id() && tok->bos_id() && tok->pad_id());
  EXPECT_EQ(c.stop_token_ids(), std::vector<int64_t>{*tok->eos_id()});
  EXPECT_EQ(c.bos_token_id, *tok->bos_id());
  ASSERT_TRUE(c.generation.has_value());
  EXPECT_EQ(c.generation->eos_token_ids, std::vector<int64_t>{*tok->eos_id()});

  const json summary = json::parse(inspect_model(out));
  EXPECT_TRUE(summary["tensors_match_config"].get<bool>()) << summary.dump(2);
  EXPECT_EQ(summary["parameters_from_tensors"].get<int64_t>(), c.parameter_count());
}

TEST(TinyCharPreset, SameSeedSameBytes) {
  ScratchDir dir("swarm-preset");
  init_tiny_char(dir.path() / "a", 7);
  init_tiny_char(dir.path() / "b", 7);
  init_tiny_char(dir.path() / "c", 8);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"})
    EXPECT_EQ(testing::read_file(dir.path() / "a" / f), testing::read_file(dir.path() / "b" / f)) << f;
  EXPECT_NE(testing::read_file(dir.path() / "a" / "model.safetensors"),
            testing::read_file(dir.path() / "c" / "model.safetensors"));
  init_tiny_char(dir.path() / "bf16", 7, DType::BF16);
  EXPECT_EQ(ModelConfig::from_directory(dir.path() / "bf16").torch_dtype, "bfloat16");
}

TEST(TinyCharPreset, TokenizerRoundTripsPrintableAscii) {
  ScratchDir dir("swarm-preset");
  const auto tok = Tokenizer::from_directory(init_tiny_char(dir.path() / "m").string());
  const std::string alphabet = ascii_alphabet();
  std::vector<TokenId> seen;
  for (char ch : alphabet) {
    const std::string s(1, ch);
    const auto ids = tok->encode(s, false);
    ASSERT_EQ(ids.size(), 1u) << "'" << s << "'";
    EXPECT_FALSE(tok->is_special(ids[0]));
    EXPECT_EQ(tok->decode(ids), s);
    EXPECT_EQ(tok->token_bytes(ids[0]), s);
    EXPECT_EQ(std::find(seen.begin(), seen.end(), ids[0]), seen.end()) << "'" << s << "' shares an id";
    seen.push_back(ids[0]);
  }
  // Whole strings: one token per character, decoded back exactly (spaces included).
  const std::vector<std::string> texts = {alphabet, "sort 3141", "  two  spaces \n\tx ",
                                          "a<b>c {x} [y] 'q' \"z\" \\ ~"};
  for (const std::string& text : texts) {
    const auto ids = tok->encode(text, false);
    EXPECT_EQ(ids.size(), text.size()) << text;
    EXPECT_EQ(tok->decode(ids), text);
    EXPECT_EQ(tok->encode(text, true), ids) << "add_special_tokens adds nothing";
  }
  // Streaming decode gives the same text.
  auto dec = tok->incremental_decoder();
  std::string streamed;
  for (TokenId id : tok->encode(alphabet, false)) streamed += dec.push(id);
  EXPECT_EQ(streamed + dec.flush(), alphabet);

  // Special tokens are single ids, skipped when decoding with skip_special_tokens.
  const auto ids = tok->encode("<|bos|><|user|>hi<|assistant|>ok<|eos|>", false);
  ASSERT_EQ(ids.size(), 8u);
  EXPECT_EQ(ids[0], *tok->bos_id());
  EXPECT_EQ(ids[7], *tok->eos_id());
  EXPECT_EQ(tok->decode(ids, true), "hiok");
  EXPECT_EQ(tok->decode(ids, false), "<|bos|><|user|>hi<|assistant|>ok<|eos|>");

  // Anything outside the alphabet is <unk> (one per character).
  const auto unk = tok->token_to_id("<unk>");
  ASSERT_TRUE(unk.has_value());
  EXPECT_EQ(tok->encode("\xC3\xA9", false), std::vector<TokenId>{*unk});
  const std::string euro = "a\xE2\x82\xAC";
  EXPECT_EQ(tok->encode(euro + "b", false).size(), 3u);
}

TEST(TinyCharPreset, ChatTemplateIsShortAndMatchesJinja2) {
  ScratchDir dir("swarm-preset");
  const fs::path out = init_tiny_char(dir.path() / "m");
  const ChatTemplate tmpl = ChatTemplate::from_directory(out.string());
  const auto tok = Tokenizer::from_directory(out.string());
  EXPECT_EQ(tmpl.bos_token(), "<|bos|>");
  EXPECT_EQ(tmpl.eos_token(), "<|eos|>");

  const ojson user = ojson::array({{{"role", "user"}, {"content", "sort 3141"}}});
  const std::string prompt = tmpl.render(user, nullptr, true);
  EXPECT_EQ(prompt, "<|bos|><|user|>sort 3141<|assistant|>");
  EXPECT_EQ(tok->encode(prompt, false).size(), 3u + 9u);
  EXPECT_EQ(tmpl.render(user, nullptr, false), "<|bos|><|user|>sort 3141");

  const ojson chat = ojson::array({{{"role", "system"}, {"content", "be brief"}},
                                   {{"role", "user"}, {"content", "rev abc"}},
                                   {{"role", "assistant"}, {"content", "cba"}},
                                   {{"role", "tool"}, {"content", "ok"}}});
  EXPECT_EQ(tmpl.render(chat, nullptr, true),
            "<|bos|><|system|>be brief<|user|>rev abc<|assistant|>cba<|eos|><|user|>ok<|assistant|>");

  // Byte-for-byte what transformers' apply_chat_template (Python jinja2) renders.
  ojson cases = ojson::array();
  for (const ojson* messages : {&user, &chat})
    for (bool gen : {true, false})
      cases.push_back({{"template", tmpl.source()},
                       {"bos_token", "<|bos|>"},
                       {"eos_token", "<|eos|>"},
                       {"messages", *messages},
                       {"tools", nullptr},
                       {"add_generation_prompt", gen},
                       {"extra", ojson::object()}});
  const json ref = testing::run_python_reference(kSource + "/tests/reference/render_chat_template.py",
                                                 json::parse(cases.dump()), dir.path());
  ASSERT_EQ(ref.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(ref[i]["ok"].get<bool>()) << ref[i].dump();
    EXPECT_EQ(tmpl.render(cases[i]["messages"], nullptr, cases[i]["add_generation_prompt"].get<bool>()),
              ref[i]["output"].get<std::string>());
  }
}

// The JS port of Hugging Face tokenizers reads the same files and gives the same ids.
TEST(TinyCharPreset, TokenizerMatchesJsReference) {
  const std::string js_dir = kSource + "/tests/js";
  ASSERT_TRUE(fs::exists(js_dir + "/node_modules/@lenml/tokenizers/package.json"))
      << "the JS reference tokenizer is not installed (" << js_dir << "/node_modules): run scripts/setup.sh";
  ASSERT_EQ(std::system("node --version > /dev/null 2>&1"), 0) << "node is not on PATH: run scripts/setup.sh";
  ScratchDir dir("swarm-preset");
  const fs::path out = init_tiny_char(dir.path() / "m");
  const auto tok = Tokenizer::from_directory(out.string());
  const std::vector<std::string> texts = {ascii_alphabet(),  "sort 3141",
                                          "  a  b \n\n c\t", "<|bos|><|user|>rev abc<|assistant|>cba<|eos|>",
                                          "caf\xC3\xA9 x",   "<|user|><|user|>x<|pad|>"};
  const json request = {{"tokenizer_dir", out.string()}, {"texts", texts}, {"add_special_tokens", true}};
  std::ofstream(dir.path() / "js.in.json") << request.dump();
  const std::string cmd =
      "node '" + js_dir + "/tokenize_reference.mjs' < '" + (dir.path() / "js.in.json").string() + "' > '" +
      (dir.path() / "js.out.json").string() + "' 2> '" + (dir.path() / "js.err.txt").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << testing::read_file(dir.path() / "js.err.txt");
  const json ref = json::parse(testing::read_file(dir.path() / "js.out.json"));
  for (size_t i = 0; i < texts.size(); ++i) {
    SCOPED_TRACE(json(texts[i]).dump());
    EXPECT_EQ(tok->encode(texts[i], true), ref["ids"][i].get<std::vector<TokenId>>());
    EXPECT_EQ(tok->decode(tok->encode(texts[i], true), true), ref["decoded"][i].get<std::string>());
    EXPECT_EQ(tok->decode(tok->encode(texts[i], true), false),
              ref["decoded_with_special"][i].get<std::string>());
  }
}

TEST(TinyCharPreset, FromAndPresetAreExclusive) {
  ScratchDir dir("swarm-preset");
  InitModelOptions o;
  o.out = dir.path() / "m";
  try {
    init_random_model(o);
    FAIL() << "no error without --from or --preset";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("--preset"), std::string::npos) << e.what();
  }
  o.preset = "tiny-char";
  o.from = dir.path();
  EXPECT_THROW(init_random_model(o), SwarmError);
  o.from.clear();
  o.preset = "huge-char";
  try {
    init_random_model(o);
    FAIL() << "no error for an unknown preset";
  } catch (const SwarmError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown preset 'huge-char' (known: tiny-char"), std::string::npos)
        << e.what();
  }
  // Config overrides apply to presets too.
  o.preset = "tiny-char";
  o.config_overrides = {{"num_hidden_layers", "2"}};
  init_random_model(o);
  EXPECT_EQ(ModelConfig::from_directory(o.out).num_hidden_layers, 2);
}

}  // namespace
}  // namespace swarm
