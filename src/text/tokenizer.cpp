// Loading tokenizer.json / tokenizer_config.json and encoding; decoding lives in
// tokenizer_decode.cpp. Semantics follow the Rust `tokenizers` library step by step (its
// AddedVocabulary, NormalizedString::split, BPE merge_word) so that ids match to the last one.
#include "text/tokenizer.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "common/error.hpp"
#include "common/json_nesting.hpp"
#include "text/tokenizer_pipeline.hpp"
#include "text/tokenizer_unicode.hpp"

namespace swarm {
namespace tokenizer_detail {
namespace {

using json = nlohmann::json;

constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";  // U+2581 "▁"
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

/// Error while reading one of the two files: carries the file name for the message.
struct LoadError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& what) { throw LoadError(what); }

bool get_bool(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(std::string("\"") + key + "\" must be a boolean");
  return it->get<bool>();
}

std::string get_string(const json& j, const char* key, const std::string& fallback = "") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string()) fail(std::string("\"") + key + "\" must be a string");
  return it->get<std::string>();
}

size_t get_size(const json& j, const char* key, size_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_unsigned()) fail(std::string("\"") + key + "\" must be a non-negative integer");
  return it->get<size_t>();
}

const json& get_array(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) fail(where + " needs an array \"" + key + "\"");
  return *it;
}

std::string type_of(const json& j, const std::string& what) {
  if (!j.is_object()) fail(what + " must be an object");
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) fail(what + " has no \"type\"");
  return it->get<std::string>();
}

// {"String": "..."} or {"Regex": "..."}.
std::unique_ptr<Regex> compile_pattern(const json& p, const std::string& where, std::string* literal) {
  if (!p.is_object()) fail(where + ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
  try {
    if (auto it = p.find("String"); it != p.end() && it->is_string()) {
      if (literal) *literal = it->get<std::string>();
      return Regex::literal(it->get<std::string>());
    }
    if (auto it = p.find("Regex"); it != p.end() && it->is_string()) {
      if (literal) literal->clear();
      return Regex::compile(it->get<std::string>());
    }
  } catch (const std::invalid_argument& e) {
    fail(where + ": " + e.what());
  }
  fail(where + ": \"pattern\" must be {\"String\": ...} or {\"Regex\": ...}");
}

// A special token in tokenizer_config.json: "text", {"content": "text", ...} or null.
std::string config_token(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail(std::string("\"") + key + "\" must be a string or an object with \"content\"");
}

// ------------------------------------------------------------------ parsing the pipeline

void parse_normalizer(const json& j, std::vector<NormalizerStep>& out) {
  if (j.is_null()) return;
  std::string type = type_of(j, "normalizer");
  if (type == "Sequence") {
    for (const json& n : get_array(j, "normalizers", "normalizer Sequence")) parse_normalizer(n, out);
  } else if (type == "Prepend") {
    out.emplace_back(NormalizerStep::Kind::PREPEND, get_string(j, "prepend"));
  } else if (type == "Replace") {
    NormalizerStep step(NormalizerStep::Kind::REPLACE, get_string(j, "content"));
    step.pattern = compile_pattern(j.value("pattern", json()), "normalizer Replace", nullptr);
    out.push_back(std::move(step));
  } else if (type == "NFC") {
    out.emplace_back(NormalizerStep::Kind::NFC);
  } else if (type == "Strip") {
    NormalizerStep step(NormalizerStep::Kind::STRIP);
    step.strip_left = get_bool(j, "strip_left", true);
    step.strip_right = get_bool(j, "strip_right", true);
    out.push_back(std::move(step));
  } else {
    fail("unsupported normalizer \"" + type + "\"");
  }
}

PrependScheme parse_prepend_scheme(const json& j) {
  std::string scheme = get_string(j, "prepend_scheme");
  if (scheme.empty())
    return get_bool(j, "add_prefix_space", true) ? PrependScheme::ALWAYS : PrependScheme::NEVER;
  if (scheme == "always") return PrependScheme::ALWAYS;
  if (scheme == "first") return PrependScheme::FIRST;
  if (scheme == "never") return PrependScheme::NEVER;
  fail("unsupported Metaspace prepend_scheme \"" + scheme + "\"");
}

PreTokenizerStep split_step(const char* pattern, SplitBehavior behavior, bool invert) {
  PreTokenizerStep step(PreTokenizerStep::Kind::SPLIT);
  step.pattern = Regex::compile(pattern);
  step.behavior = behavior;
  step.invert = invert;
  return step;
}

void parse_pre_tokenizer(const json& j, std::vector<PreTokenizerStep>& out) {
  if (j.is_null()) return;
  std::string type = type_of(j, "pre_tokenizer");
  using K = PreTokenizerStep::Kind;
  if (type == "Sequence") {
    for (const json& p : get_array(j, "pretokenizers", "pre_tokenizer Sequence")) parse_pre_tokenizer(p, out);
  } else if (type == "ByteLevel") {
    PreTokenizerStep step(K::BYTE_LEVEL);
    step.add_prefix_space = get_bool(j, "add_prefix_space", true);
    step.use_regex = get_bool(j, "use_regex", true);
    if (step.use_regex) step.pattern = Regex::compile(kGpt2Pattern);
    out.push_back(std::move(step));
  } else if (type == "Split") {
    PreTokenizerStep step(K::SPLIT);
    step.pattern = compile_pattern(j.value("pattern", json()), "pre_tokenizer Split", nullptr);
    std::string behavior = get_string(j, "behavior", "Isolated");
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::REMOVED},
        {"Isolated", SplitBehavior::ISOLATED},
        {"MergedWithPrevious", SplitBehavior::MERGED_WITH_PREVIOUS},
        {"MergedWithNext", SplitBehavior::MERGED_WITH_NEXT},
        {"Contiguous", SplitBehavior::CONTIGUOUS}};
    auto it = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                           [&](const auto& b) { return behavior == b.first; });
    if (it == std::end(kBehaviors)) fail("unsupported Split behavior \"" + behavior + "\"");
    step.behavior = it->second;
    step.invert = get_bool(j, "invert", false);
    out.push_back(std::move(step));
  } else if (type == "Digits") {
    // Rust splits on char::is_numeric, i.e. general categories Nd, Nl, No.
    out.push_back(get_bool(j, "individual_digits", false)
                      ? split_step(R"(\p{N})", SplitBehavior::ISOLATED, false)
                      : split_step(R"(\p{N}+)", SplitBehavior::ISOLATED, false));
  } else if (type == "Metaspace") {
    PreTokenizerStep step(K::METASPACE);
    step.replacement = get_string(j, "replacement", std::string(kSentencePieceSpace));
    step.prepend_scheme = parse_prepend_scheme(j);
    step.split = get_bool(j, "split", true);
    step.pattern = Regex::literal(step.replacement);
    out.push_back(std::move(step));
  } else if (type == "Whitespace") {
    out.push_back(split_step(R"(\w+|[^\w\s]+)", SplitBehavior::REMOVED, true));
  } else if (type == "WhitespaceSplit") {
    out.push_back(split_step(R"(\s)", SplitBehavior::REMOVED, false));
  } else {
    fail("unsupported pre_tokenizer \"" + type + "\"");
  }
}

void parse_decoder(const json& j, std::vector<DecoderStep>& out, bool& text) {
  std::string type = type_of(j, "decoder");
  using K = DecoderStep::Kind;
  if (type == "Sequence") {
    for (const json& d : get_array(j, "decoders", "decoder Sequence")) parse_decoder(d, out, text);
  } else if (type == "ByteLevel") {
    if (text) fail("unsupported decoder chain: ByteLevel after Fuse");
    out.push_back({K::BYTE_LEVEL});
    text = true;
  } else if (type == "Replace") {
    DecoderStep step(K::REPLACE);
    step.pattern = compile_pattern(j.value("pattern", json()), "decoder Replace", &step.pattern_literal);
    step.content = get_string(j, "content");
    if (!step.pattern_literal.empty()) step.pattern.reset();  // literal: plain search
    if (text && step.pattern) fail("unsupported decoder chain: Replace with a Regex after Fuse");
    if (step.pattern || !step.pattern_literal.empty()) out.push_back(std::move(step));
  } else if (type == "ByteFallback") {
    if (text) fail("unsupported decoder chain: ByteFallback after Fuse");
    out.push_back({K::BYTE_FALLBACK});
  } else if (type == "Fuse") {
    out.push_back({K::FUSE});
    text = true;
  } else if (type == "Strip") {
    DecoderStep step(K::STRIP);
    step.content = get_string(j, "content", " ");
    if (step.content.empty() || !unicode::is_valid_utf8(step.content) ||
        unicode::char_length(static_cast<unsigned char>(step.content[0])) != step.content.size())
      fail("decoder Strip: \"content\" must be one character");
    step.start = get_size(j, "start", 0);
    step.stop = get_size(j, "stop", 0);
    out.push_back(std::move(step));
  } else if (type == "Metaspace") {
    DecoderStep step(K::METASPACE);
    step.replacement = get_string(j, "replacement", std::string(kSentencePieceSpace));
    step.drop_first = parse_prepend_scheme(j) != PrependScheme::NEVER;
    out.push_back(std::move(step));
  } else {
    fail("unsupported decoder \"" + type + "\"");
  }
}

std::vector<Id> special_ids(const json& specials, const std::string& name, const TokenizerImpl& impl) {
  if (specials.is_object()) {
    auto it = specials.find(name);
    if (it != specials.end() && it->is_object() && it->contains("ids") && (*it)["ids"].is_array())
      return (*it)["ids"].get<std::vector<Id>>();
  }
  if (auto it = impl.added_ids.find(name); it != impl.added_ids.end()) return {it->second};
  if (auto it = impl.model->vocab().find(name); it != impl.model->vocab().end()) return {it->second};
  fail("post_processor: special token \"" + name + "\" is not in the vocabulary");
}

void parse_post_processor(const json& j, TokenizerImpl& impl) {
  if (j.is_null()) return;
  std::string type = type_of(j, "post_processor");
  if (type == "Sequence") {
    for (const json& p : get_array(j, "processors", "post_processor Sequence")) parse_post_processor(p, impl);
  } else if (type == "ByteLevel") {
    // Only trims offsets; adds no ids.
  } else if (type == "TemplateProcessing") {
    Template t;
    bool seen_sequence = false;
    for (const json& item : get_array(j, "single", "post_processor TemplateProcessing")) {
      if (item.contains("SpecialToken")) {
        std::string name = get_string(item["SpecialToken"], "id");
        auto ids = special_ids(j.value("special_tokens", json()), name, impl);
        auto& side = seen_sequence ? t.after : t.before;
        side.insert(side.end(), ids.begin(), ids.end());
      } else if (item.contains("Sequence")) {
        seen_sequence = true;
      } else {
        fail("post_processor TemplateProcessing: unknown template item " + item.dump());
      }
    }
    impl.templates.push_back(std::move(t));
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto id_of = [&](const char* key) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer())
        fail("post_processor " + type + " needs \"" + key + "\": [token, id]");
      return (*it)[1].get<Id>();
    };
    impl.templates.push_back(Template{{id_of("cls")}, {id_of("sep")}});
  } else {
    fail("unsupported post_processor \"" + type + "\"");
  }
}

std::unique_ptr<BpeModel> parse_model(const json& m, bool byte_level) {
  if (!m.is_object()) fail("\"model\" must be an object");
  std::string type = m.contains("type") ? get_string(m, "type") : (m.contains("merges") ? "BPE" : "");
  if (type != "BPE") fail("unsupported model \"" + type + "\" (only BPE is supported)");
  if (auto it = m.find("dropout"); it != m.end() && !it->is_null() && it->get<double>() > 0.0)
    fail("unsupported BPE option: dropout");
  auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object()) fail("model needs an object \"vocab\"");
  Vocab vocab;
  vocab.reserve(vit->size());
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it.value().is_number_integer()) fail("model vocab: id of \"" + it.key() + "\" is not an integer");
    vocab.emplace(it.key(), it.value().get<Id>());
  }
  std::vector<std::pair<std::string, std::string>> merges;
  const json& jm = get_array(m, "merges", "model");
  merges.reserve(jm.size());
  for (const json& merge : jm) {
    if (merge.is_string()) {  // "a b"
      const auto& s = merge.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail("model merges: \"" + s + "\" is not two tokens separated by one space");
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      fail("model merges: entry " + merge.dump() + " is neither \"a b\" nor [a, b]");
    }
  }
  BpeOptions options;
  if (auto it = m.find("unk_token"); it != m.end() && it->is_string())
    options.unk_token = it->get<std::string>();
  options.continuing_subword_prefix = get_string(m, "continuing_subword_prefix");
  options.end_of_word_suffix = get_string(m, "end_of_word_suffix");
  options.fuse_unk = get_bool(m, "fuse_unk", false);
  options.byte_fallback = get_bool(m, "byte_fallback", false);
  options.ignore_merges = get_bool(m, "ignore_merges", false);
  options.byte_level = byte_level;
  try {
    return std::make_unique<BpeModel>(std::move(vocab), merges, std::move(options));
  } catch (const std::invalid_argument& e) {
    fail(std::string("model: ") + e.what());
  }
}

// Applies the normalizer steps to s in place (HF's NormalizedString operations, minus offsets).
void normalize(const std::vector<NormalizerStep>& steps, std::string& s) {
  std::string tmp;
  for (const NormalizerStep& step : steps) {
    switch (step.kind) {
      case NormalizerStep::Kind::PREPEND:
        if (!s.empty()) s.insert(0, step.text);
        break;
      case NormalizerStep::Kind::REPLACE: {
        tmp.clear();
        size_t prev = 0;
        step.pattern->for_each_match(s, [&](size_t b, size_t e) {
          tmp.append(s, prev, b - prev);
          tmp += step.text;
          prev = e;
        });
        if (prev == 0 && tmp.empty()) break;  // no match
        tmp.append(s, prev, std::string::npos);
        s.swap(tmp);
        break;
      }
      case NormalizerStep::Kind::NFC:
        if (unicode::nfc(s, tmp)) s.swap(tmp);
        break;
      case NormalizerStep::Kind::STRIP: {
        size_t b = 0, e = s.size();
        if (step.strip_left)
          while (b < e) {
            size_t i = b;
            if (!unicode::is_white_space(unicode::next_code_point(s, i))) break;
            b = i;
          }
        if (step.strip_right)
          while (e > b) {
            size_t start = e - 1;
            while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
            size_t i = start;
            if (!unicode::is_white_space(unicode::next_code_point(s, i))) break;
            e = start;
          }
        s = s.substr(b, e - b);
        break;
      }
    }
  }
}

bool is_sentencepiece_shaped(const TokenizerImpl& impl) {
  for (const auto& n : impl.normalizer) {
    bool prepend = n.kind == NormalizerStep::Kind::PREPEND && n.text == kSentencePieceSpace;
    bool replace = n.kind == NormalizerStep::Kind::REPLACE && n.text == kSentencePieceSpace;
    if (!prepend && !replace) return false;
  }
  for (const auto& p : impl.pre_tokenizer)
    if (p.kind != PreTokenizerStep::Kind::METASPACE) return false;
  return true;
}

std::unique_ptr<TokenizerImpl> build(const json& tj) {
  auto impl = std::make_unique<TokenizerImpl>();
  if (!tj.is_object()) fail("not a JSON object");
  parse_normalizer(tj.value("normalizer", json()), impl->normalizer);
  parse_pre_tokenizer(tj.value("pre_tokenizer", json()), impl->pre_tokenizer);
  bool byte_level_pre = false;
  for (size_t i = 0; i < impl->pre_tokenizer.size(); ++i) {
    if (impl->pre_tokenizer[i].kind != PreTokenizerStep::Kind::BYTE_LEVEL) continue;
    if (i + 1 != impl->pre_tokenizer.size())
      fail("unsupported pre_tokenizer Sequence: ByteLevel must come last");
    byte_level_pre = true;
  }
  if (!tj.contains("model")) fail("no \"model\"");
  impl->model = parse_model(tj["model"], byte_level_pre);

  // Vocabulary: model tokens, then added tokens (which win for their ids).
  const Vocab& vocab = impl->model->vocab();
  Id max_id = -1;
  for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
  if (auto it = tj.find("added_tokens"); it != tj.end() && !it->is_null()) {
    if (!it->is_array()) fail("\"added_tokens\" must be an array");
    for (const json& a : *it) {
      AddedToken t;
      t.content = get_string(a, "content");
      if (!a.contains("id") || !a["id"].is_number_integer()) fail("added token without an integer \"id\"");
      t.id = a["id"].get<Id>();
      if (t.id < 0) fail("added token \"" + t.content + "\" has a negative id");
      t.single_word = get_bool(a, "single_word", false);
      t.lstrip = get_bool(a, "lstrip", false);
      t.rstrip = get_bool(a, "rstrip", false);
      t.special = get_bool(a, "special", false);
      t.normalized = get_bool(a, "normalized", !t.special);
      if (t.content.empty()) continue;
      max_id = std::max(max_id, t.id);
      impl->added.push_back(std::move(t));
    }
  }
  if (max_id < 0) fail("empty vocabulary");
  // The id table is as long as the largest id: a hostile file with one huge id must not make it
  // gigabytes. Real vocabularies are dense and far below 2^22 (4M) ids.
  const int64_t entries = static_cast<int64_t>(vocab.size() + impl->added.size());
  if (max_id >= (int64_t{1} << 22) || max_id > 2 * entries + 65536)
    fail("token id " + std::to_string(max_id) + " is too large for " + std::to_string(entries) +
         " tokens (ids must be below 4194304 and nearly dense)");
  impl->id_to_token.assign(static_cast<size_t>(max_id) + 1, std::string());
  impl->is_added.assign(impl->id_to_token.size(), 0);
  impl->is_special.assign(impl->id_to_token.size(), 0);
  for (const auto& [token, id] : vocab) {
    if (id < 0) fail("model vocab: negative id for \"" + token + "\"");
    impl->id_to_token[static_cast<size_t>(id)] = token;
  }
  for (const AddedToken& t : impl->added) {
    impl->id_to_token[static_cast<size_t>(t.id)] = t.content;
    impl->is_added[static_cast<size_t>(t.id)] = 1;
    if (t.special) impl->is_special[static_cast<size_t>(t.id)] = 1;
    impl->added_ids[t.content] = t.id;
  }

  parse_post_processor(tj.value("post_processor", json()), *impl);
  if (auto it = tj.find("decoder"); it != tj.end() && !it->is_null()) {
    impl->has_decoder = true;
    bool text = false;
    parse_decoder(*it, impl->decoder, text);
  }
  for (const auto& d : impl->decoder)
    if (d.kind == DecoderStep::Kind::BYTE_LEVEL) impl->byte_level_tokens = true;

  return impl;
}

// Tokenizer classes whose fast implementation in transformers rebuilds the post-processor
// from add_bos_token / add_eos_token when it is made (`update_post_processor`), whatever
// tokenizer.json holds; the class's defaults apply to an absent key. AutoTokenizer loads the
// fast class for a slow name too, so both spellings count. Every other class (the generic
// PreTrainedTokenizerFast, Qwen2, GPT-2, ...) keeps tokenizer.json's post-processor.
struct RebuildingClass {
  const char* name;
  bool add_bos, add_eos;
  const char* bos;  // the class's default tokens, used when tokenizer_config.json names none
  const char* eos;
};

const RebuildingClass* rebuilding_class(std::string_view cls) {
  static const RebuildingClass kClasses[] = {
      {"LlamaTokenizer", true, false, "<s>", "</s>"},
      {"CodeLlamaTokenizer", true, false, "<s>", "</s>"},
      {"GemmaTokenizer", true, false, "<bos>", "<eos>"},
      {"CohereTokenizer", true, false, "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"},
      {"GPTNeoXTokenizer", false, false, "<|endoftext|>", "<|endoftext|>"},
  };
  if (cls.ends_with("Fast")) cls.remove_suffix(4);
  for (const RebuildingClass& c : kClasses)
    if (cls == c.name) return &c;
  return nullptr;
}

// A flag the class's constructor receives: absent → the class default; null → false (Python
// passes None, which is falsy).
bool config_flag(const json& config, const char* key, bool class_default) {
  auto it = config.find(key);
  if (it == config.end()) return class_default;
  if (it->is_null()) return false;
  if (!it->is_boolean()) fail(std::string("\"") + key + "\" must be a boolean");
  return it->get<bool>();
}

// tokenizer_config.json, then what depends on both files.
void apply_config(TokenizerImpl* impl, const json& config) {
  const Vocab& vocab = impl->model->vocab();
  bool byte_level_pre =
      std::any_of(impl->pre_tokenizer.begin(), impl->pre_tokenizer.end(),
                  [](const auto& p) { return p.kind == PreTokenizerStep::Kind::BYTE_LEVEL; });
  auto lookup = [&](const std::string& token) -> std::optional<Id> {
    if (token.empty()) return std::nullopt;
    if (auto it = impl->added_ids.find(token); it != impl->added_ids.end()) return it->second;
    if (auto it = vocab.find(token); it != vocab.end()) return it->second;
    return std::nullopt;
  };
  impl->bos_token = config_token(config, "bos_token");
  impl->eos_token = config_token(config, "eos_token");
  impl->bos_id = lookup(impl->bos_token);
  impl->eos_id = lookup(impl->eos_token);
  impl->pad_id = lookup(config_token(config, "pad_token"));
  // transformers registers the config's special tokens as special: decode skips them too.
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
    if (auto id = lookup(config_token(config, key))) impl->is_special[static_cast<size_t>(*id)] = 1;
  if (auto it = config.find("additional_special_tokens"); it != config.end() && it->is_array()) {
    for (const json& t : *it) {
      std::string content = t.is_string()   ? t.get<std::string>()
                            : t.is_object() ? t.value("content", std::string())
                                            : std::string();
      if (auto id = lookup(content)) impl->is_special[static_cast<size_t>(*id)] = 1;
    }
  }
  impl->clean_up_tokenization_spaces = get_bool(config, "clean_up_tokenization_spaces", false);
  std::string cls = get_string(config, "tokenizer_class");
  if (const RebuildingClass* rebuild = rebuilding_class(cls)) {
    // These classes replace tokenizer.json's post-processor by bos + sequence + eos as the
    // config's add_bos_token / add_eos_token say (the class defaults where a key is absent).
    impl->templates.clear();
    const auto token_id = [&](const std::string& configured, const char* fallback, const char* what) {
      const std::string token = configured.empty() ? std::string(fallback) : configured;
      auto id = lookup(token);
      if (!id) fail(std::string(what) + " is set but its token \"" + token + "\" is not in the vocabulary");
      return *id;
    };
    if (config_flag(config, "add_bos_token", rebuild->add_bos))
      impl->config_bos = token_id(impl->bos_token, rebuild->bos, "add_bos_token");
    if (config_flag(config, "add_eos_token", rebuild->add_eos))
      impl->config_eos = token_id(impl->eos_token, rebuild->eos, "add_eos_token");
  } else if (impl->templates.empty()) {
    // No post-processor adding ids: transformers adds bos/eos when the config asks for them.
    if (get_bool(config, "add_bos_token", false)) {
      if (!impl->bos_id) fail("add_bos_token is set but bos_token is not in the vocabulary");
      impl->config_bos = impl->bos_id;
    }
    if (get_bool(config, "add_eos_token", false)) {
      if (!impl->eos_id) fail("add_eos_token is set but eos_token is not in the vocabulary");
      impl->config_eos = impl->eos_id;
    }
  }
  impl->sentencepiece_non_legacy = (cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast") &&
                                   !get_bool(config, "legacy", true) && !byte_level_pre &&
                                   is_sentencepiece_shaped(*impl);

  // Added-token matchers. The SentencePiece non-legacy path matches all of them in the raw text.
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    if (!t.normalized || impl->sentencepiece_non_legacy) {
      impl->raw_matcher.add(t.content, i);
    } else {
      std::string content = t.content;
      normalize(impl->normalizer, content);
      impl->normalized_matcher.add(content, i);
    }
  }
  bool single_word =
      std::any_of(impl->added.begin(), impl->added.end(), [](const AddedToken& t) { return t.single_word; });
  if (single_word) impl->word_char = Regex::compile(R"(\w)");
}

}  // namespace
}  // namespace tokenizer_detail
}  // namespace swarm

namespace swarm {
namespace tokenizer_detail {

// ------------------------------------------------------------------ added tokens

void AddedTokenMatcher::add(std::string_view pattern, size_t index) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (unsigned char c : pattern) {
    int32_t next = child(node, c);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& children = nodes_[static_cast<size_t>(node)].children;
      children.insert(std::upper_bound(children.begin(), children.end(), std::make_pair(c, INT32_MIN)),
                      {c, next});
    }
    node = next;
  }
  // A content listed twice keeps its first entry.
  if (nodes_[static_cast<size_t>(node)].pattern < 0)
    nodes_[static_cast<size_t>(node)].pattern = static_cast<int64_t>(index);
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char c) const {
  const auto& children = nodes_[static_cast<size_t>(node)].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(c, INT32_MIN));
  return it != children.end() && it->first == c ? it->second : -1;
}

bool AddedTokenMatcher::find(std::string_view text, size_t from, size_t& begin, size_t& end,
                             size_t& index) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    int32_t node = 0;
    int64_t best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (nodes_[static_cast<size_t>(node)].pattern >= 0) {
        best = nodes_[static_cast<size_t>(node)].pattern;
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      begin = i;
      end = best_end;
      index = static_cast<size_t>(best);
      return true;
    }
  }
  return false;
}

namespace {

struct Segment {
  size_t begin, end;
  Id added = -1;  // >= 0: an added token
};

// Start of the last UTF-8 character ending at `end` (end > 0).
size_t last_char_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

bool is_word_char(const Regex& word, std::string_view ch) {
  size_t b = 0, e = 0;
  return word.find(ch, 0, b, e) && b == 0 && e == ch.size();
}

// HF AddedVocabulary::find_matches: leftmost-longest matches, single_word, lstrip, rstrip.
void split_added(const TokenizerImpl& impl, const AddedTokenMatcher& matcher, std::string_view text,
                 std::vector<Segment>& out) {
  size_t start_offset = 0, from = 0, b = 0, e = 0, index = 0;
  while (from < text.size() && matcher.find(text, from, b, e, index)) {
    from = e;
    const AddedToken& t = impl.added[index];
    size_t start = b, stop = e;
    if (t.single_word) {
      bool start_space =
          start == 0 || !is_word_char(*impl.word_char, text.substr(last_char_start(text, start),
                                                                   start - last_char_start(text, start)));
      bool stop_space =
          stop == text.size() ||
          !is_word_char(*impl.word_char,
                        text.substr(stop, unicode::char_length(static_cast<unsigned char>(text[stop]))));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t c = last_char_start(text, s);
        size_t i = c;
        if (!unicode::is_white_space(unicode::next_code_point(text, i))) break;
        s = c;
      }
      start = std::max(s, start_offset);
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        size_t i = stop;
        if (!unicode::is_white_space(unicode::next_code_point(text, i))) break;
        stop = i;
      }
      from = std::max(from, stop);
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({start_offset, text.size(), -1});
}

// ------------------------------------------------------------------ pre-tokenization

struct Span {
  uint32_t begin, end;
  bool at_start;  // starts at offset 0 of the original text (Metaspace "first")
};

struct PreTokenized {
  std::string arena;
  std::vector<Span> spans, next;
  std::vector<std::pair<Span, bool>> matches;  // (offsets in the span, is_match)
};

void split_span(const Regex& pattern, SplitBehavior behavior, bool invert, PreTokenized& pt,
                const Span& span) {
  std::string_view s(pt.arena.data() + span.begin, span.end - span.begin);
  auto& m = pt.matches;
  m.clear();
  uint32_t prev = 0;
  pattern.for_each_match(s, [&](size_t b, size_t e) {
    if (prev != b) m.push_back({{prev, static_cast<uint32_t>(b), false}, false});
    m.push_back({{static_cast<uint32_t>(b), static_cast<uint32_t>(e), false}, true});
    prev = static_cast<uint32_t>(e);
  });
  if (prev != s.size()) m.push_back({{prev, static_cast<uint32_t>(s.size()), false}, false});
  if (invert)
    for (auto& x : m) x.second = !x.second;

  // Behavior: which pieces to keep (HF NormalizedString::split).
  std::vector<std::pair<Span, bool>>& pieces = m;  // rewritten in place: (offsets, remove)
  size_t w = 0;
  switch (behavior) {
    case SplitBehavior::ISOLATED:
      for (auto& x : pieces) x.second = false;
      w = pieces.size();
      break;
    case SplitBehavior::REMOVED:
      w = pieces.size();
      break;
    case SplitBehavior::CONTIGUOUS: {
      bool previous_match = false;
      for (size_t i = 0; i < pieces.size(); ++i) {
        bool is_match = pieces[i].second;
        if (w > 0 && is_match == previous_match)
          pieces[w - 1].first.end = pieces[i].first.end;
        else
          pieces[w++] = {pieces[i].first, false};
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::MERGED_WITH_PREVIOUS: {
      bool previous_match = false;
      for (size_t i = 0; i < pieces.size(); ++i) {
        bool is_match = pieces[i].second;
        if (w > 0 && is_match && !previous_match)
          pieces[w - 1].first.end = pieces[i].first.end;
        else
          pieces[w++] = {pieces[i].first, false};
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::MERGED_WITH_NEXT: {
      // Walk backwards: a delimiter joins the piece after it.
      std::vector<std::pair<Span, bool>> rev;
      bool previous_match = false;
      for (size_t i = pieces.size(); i-- > 0;) {
        bool is_match = pieces[i].second;
        if (!rev.empty() && is_match && !previous_match)
          rev.back().first.begin = pieces[i].first.begin;
        else
          rev.push_back({pieces[i].first, false});
        previous_match = is_match;
      }
      std::reverse(rev.begin(), rev.end());
      pieces = std::move(rev);
      w = pieces.size();
      break;
    }
  }
  for (size_t i = 0; i < w; ++i) {
    const auto& [off, remove] = pieces[i];
    if (remove || off.begin == off.end) continue;
    pt.next.push_back({span.begin + off.begin, span.begin + off.end, span.at_start && off.begin == 0});
  }
}

// Appends `text` to the arena as a new span.
Span add_span(PreTokenized& pt, std::string_view text, bool at_start) {
  auto b = static_cast<uint32_t>(pt.arena.size());
  pt.arena.append(text);
  return {b, static_cast<uint32_t>(pt.arena.size()), at_start};
}

void apply_pre_tokenizer(const PreTokenizerStep& step, PreTokenized& pt) {
  pt.next.clear();
  std::string tmp;
  for (size_t k = 0; k < pt.spans.size(); ++k) {
    Span span = pt.spans[k];
    switch (step.kind) {
      case PreTokenizerStep::Kind::SPLIT:
        split_span(*step.pattern, step.behavior, step.invert, pt, span);
        break;
      case PreTokenizerStep::Kind::BYTE_LEVEL:
        if (step.add_prefix_space && pt.arena[span.begin] != ' ') {
          tmp.assign(" ");
          tmp.append(pt.arena, span.begin, span.end - span.begin);
          span = add_span(pt, tmp, span.at_start);
        }
        if (step.use_regex)
          split_span(*step.pattern, SplitBehavior::ISOLATED, false, pt, span);
        else
          pt.next.push_back(span);
        break;
      case PreTokenizerStep::Kind::METASPACE: {
        tmp.clear();
        std::string_view s(pt.arena.data() + span.begin, span.end - span.begin);
        for (char c : s) {
          if (c == ' ')
            tmp += step.replacement;
          else
            tmp += c;
        }
        bool prepend = step.prepend_scheme == PrependScheme::ALWAYS ||
                       (step.prepend_scheme == PrependScheme::FIRST && span.at_start);
        if (prepend && tmp.compare(0, step.replacement.size(), step.replacement) != 0)
          tmp.insert(0, step.replacement);
        span = add_span(pt, tmp, span.at_start);
        if (step.split) {
          split_span(*step.pattern, SplitBehavior::MERGED_WITH_NEXT, false, pt, span);
        } else {
          pt.next.push_back(span);
        }
        break;
      }
    }
  }
  pt.spans.swap(pt.next);
}

}  // namespace

void TokenizerImpl::encode(std::string_view text, bool add_special_tokens, std::vector<Id>& out) const {
  std::string sanitized;
  if (!unicode::is_valid_utf8(text)) {
    unicode::append_lossy(sanitized, text);
    text = sanitized;
  }
  size_t first = out.size();
  thread_local std::vector<Segment> segments, sub;
  thread_local std::string normalized;
  thread_local PreTokenized pt;

  auto run_model = [&](std::string_view piece, bool at_start) {
    if (piece.empty()) return;
    if (pre_tokenizer.empty()) {
      model->tokenize(piece, out);
      return;
    }
    pt.arena.assign(piece);
    pt.spans.assign(1, Span{0, static_cast<uint32_t>(piece.size()), at_start});
    for (const auto& step : pre_tokenizer) apply_pre_tokenizer(step, pt);
    for (const Span& s : pt.spans)
      model->tokenize(std::string_view(pt.arena.data() + s.begin, s.end - s.begin), out);
  };

  if (sentencepiece_non_legacy) {
    // transformers' LlamaTokenizer(legacy=False): "▁" + text (with "▁" read as spaces), split
    // on added tokens, spaces -> "▁" in each section, and no "▁" token before a leading special.
    if (!text.empty()) {
      std::string t(kSentencePieceSpace);
      for (size_t i = 0; i < text.size();) {
        if (text.compare(i, kSentencePieceSpace.size(), kSentencePieceSpace) == 0) {
          t += ' ';
          i += kSentencePieceSpace.size();
        } else {
          t += text[i++];
        }
      }
      segments.clear();
      split_added(*this, raw_matcher, t, segments);
      for (size_t k = 0; k < segments.size(); ++k) {
        const Segment& seg = segments[k];
        if (seg.added >= 0) {
          out.push_back(seg.added);
          continue;
        }
        normalized.clear();
        for (size_t i = seg.begin; i < seg.end; ++i) {
          if (t[i] == ' ')
            normalized += kSentencePieceSpace;
          else
            normalized += t[i];
        }
        if (k == 0 && normalized.compare(0, kSentencePieceSpace.size(), kSentencePieceSpace) != 0)
          normalized.insert(0, kSentencePieceSpace);
        model->tokenize(normalized, out);
      }
      if (out.size() - first > 1 && id_to_token[static_cast<size_t>(out[first])] == kSentencePieceSpace &&
          is_special[static_cast<size_t>(out[first + 1])])
        out.erase(out.begin() + static_cast<std::ptrdiff_t>(first));
    }
  } else {
    segments.clear();
    if (raw_matcher.empty())
      segments.push_back({0, text.size(), -1});
    else
      split_added(*this, raw_matcher, text, segments);
    for (const Segment& seg : segments) {
      if (seg.added >= 0) {
        out.push_back(seg.added);
        continue;
      }
      std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
      if (!normalizer.empty()) {
        normalized.assign(piece);
        normalize(normalizer, normalized);
        piece = normalized;
      }
      if (normalized_matcher.empty()) {
        run_model(piece, seg.begin == 0);
        continue;
      }
      sub.clear();
      split_added(*this, normalized_matcher, piece, sub);
      for (const Segment& s : sub) {
        if (s.added >= 0)
          out.push_back(s.added);
        else
          run_model(piece.substr(s.begin, s.end - s.begin), seg.begin == 0 && s.begin == 0);
      }
    }
  }

  if (!add_special_tokens) return;
  for (const Template& t : templates) {
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(first), t.before.begin(), t.before.end());
    out.insert(out.end(), t.after.begin(), t.after.end());
  }
  if (config_bos) out.insert(out.begin() + static_cast<std::ptrdiff_t>(first), *config_bos);
  if (config_eos) out.push_back(*config_eos);
}

const std::string* TokenizerImpl::decodable(Id id, bool skip_special_tokens) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token.size()) return nullptr;
  auto i = static_cast<size_t>(id);
  if (id_to_token[i].empty() && !is_added[i]) return nullptr;  // unused id
  if (skip_special_tokens && is_special[i]) return nullptr;
  return &id_to_token[i];
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SwarmError(ErrorKind::INVALID_ARGUMENT, "cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<TokenizerImpl> load(const std::string& tokenizer_json, const std::string& config_json,
                                    const std::string& json_name, const std::string& config_name) {
  auto parse = [](const std::string& text, const std::string& name) {
    require_json_nesting(text, name);
    try {
      return json::parse(text);
    } catch (const json::exception& e) {
      throw SwarmError(ErrorKind::INVALID_ARGUMENT, name + ": malformed JSON: " + e.what());
    }
  };
  json tj = parse(tokenizer_json, json_name);
  json config = config_json.empty() ? json::object() : parse(config_json, config_name);
  if (!config.is_object()) throw SwarmError(ErrorKind::INVALID_ARGUMENT, config_name + ": not a JSON object");
  std::unique_ptr<TokenizerImpl> impl;
  const std::string* current = &json_name;
  try {
    impl = build(tj);
    current = &config_name;
    apply_config(impl.get(), config);
  } catch (const LoadError& e) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, *current + ": " + e.what());
  } catch (const json::exception& e) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, *current + ": " + e.what());
  } catch (const std::invalid_argument& e) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, *current + ": " + e.what());
  }
  return impl;
}

}  // namespace
}  // namespace tokenizer_detail

// ------------------------------------------------------------------ public API

using tokenizer_detail::DecodeState;
using tokenizer_detail::TokenizerImpl;

std::shared_ptr<const Tokenizer> Tokenizer::from_directory(const std::string& dir) {
  std::string json_path = dir + "/tokenizer.json";
  std::string config_path = dir + "/tokenizer_config.json";
  std::string tokenizer_json = tokenizer_detail::read_file(json_path);
  std::string config_json;
  if (std::ifstream(config_path).good()) config_json = tokenizer_detail::read_file(config_path);
  return std::shared_ptr<const Tokenizer>(
      new Tokenizer(tokenizer_detail::load(tokenizer_json, config_json, json_path, config_path)));
}

std::shared_ptr<const Tokenizer> Tokenizer::from_json(const std::string& tokenizer_json,
                                                      const std::string& tokenizer_config_json) {
  return std::shared_ptr<const Tokenizer>(new Tokenizer(tokenizer_detail::load(
      tokenizer_json, tokenizer_config_json, "tokenizer.json", "tokenizer_config.json")));
}

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<TokenId> ids;
  ids.reserve(text.size() / 3 + 4);
  impl_->encode(text, add_special_tokens, ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const {
  DecodeState state(*impl_, skip_special_tokens);
  std::string out;
  out.reserve(ids.size() * 4);
  for (TokenId id : ids) state.push(id, out);
  state.flush(out);
  return out;
}

const std::string& Tokenizer::token_string(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size())
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "token id " + std::to_string(id) + " is out of range [0, " +
                                                      std::to_string(impl_->id_to_token.size()) + ")");
  return impl_->id_to_token[static_cast<size_t>(id)];
}

std::string Tokenizer::token_bytes(TokenId id) const {
  const std::string& token = token_string(id);
  if (impl_->is_added[static_cast<size_t>(id)]) return token;
  if (impl_->byte_level_tokens) {
    if (auto bytes = tokenizer_detail::byte_level_to_bytes(token)) return *bytes;
    return token;
  }
  using K = tokenizer_detail::DecoderStep::Kind;
  std::string s = token;
  for (const auto& step : impl_->decoder) {
    if (step.kind == K::BYTE_FALLBACK && s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(s[3])) && std::isxdigit(static_cast<unsigned char>(s[4])))
      return std::string(1, static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
    const std::string* from = step.kind == K::REPLACE && !step.pattern ? &step.pattern_literal
                              : step.kind == K::METASPACE              ? &step.replacement
                                                                       : nullptr;
    const std::string* to = step.kind == K::REPLACE ? &step.content : nullptr;
    if (from == nullptr || from->empty()) continue;
    std::string replaced;
    for (size_t pos = 0;;) {
      size_t hit = s.find(*from, pos);
      replaced.append(s, pos, hit == std::string::npos ? std::string::npos : hit - pos);
      if (hit == std::string::npos) break;
      replaced += to ? *to : std::string(" ");
      pos = hit + from->size();
    }
    s.swap(replaced);
  }
  return s;
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  const auto& vocab = impl_->model->vocab();
  if (auto it = vocab.find(token); it != vocab.end()) return it->second;
  return std::nullopt;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->is_special.size() &&
         impl_->is_special[static_cast<size_t>(id)] != 0;
}

std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos_id; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos_id; }
std::optional<TokenId> Tokenizer::pad_id() const { return impl_->pad_id; }
const std::string& Tokenizer::bos_token() const { return impl_->bos_token; }
const std::string& Tokenizer::eos_token() const { return impl_->eos_token; }

Tokenizer::IncrementalDecoder Tokenizer::incremental_decoder(bool skip_special_tokens) const {
  return IncrementalDecoder(shared_from_this(), skip_special_tokens);
}

Tokenizer::IncrementalDecoder::IncrementalDecoder(std::shared_ptr<const Tokenizer> tokenizer,
                                                  bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)),
      state_(std::make_unique<DecodeState>(*tokenizer_->impl_, skip_special_tokens)) {}
Tokenizer::IncrementalDecoder::IncrementalDecoder(IncrementalDecoder&&) noexcept = default;
Tokenizer::IncrementalDecoder& Tokenizer::IncrementalDecoder::operator=(IncrementalDecoder&&) noexcept =
    default;
Tokenizer::IncrementalDecoder::~IncrementalDecoder() = default;

std::string Tokenizer::IncrementalDecoder::push(TokenId id) {
  std::string out;
  state_->push(id, out);
  return out;
}

std::string Tokenizer::IncrementalDecoder::flush() {
  std::string out;
  state_->flush(out);
  return out;
}

}  // namespace swarm
