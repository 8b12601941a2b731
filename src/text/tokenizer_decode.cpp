// The decoder chain as a pipeline of streaming stages. Tokenizer::decode pushes every id and
// flushes once, the IncrementalDecoder pushes ids as they come: both run the same stages, so
// a stream's pieces always add up to decode() of all its ids.
//
// Stages before the first Fuse / ByteLevel see tokens (HF applies them token by token); from
// there on the tokens have become one text, which the remaining stages see in chunks and hold
// back only what a later chunk could still change.
#include <algorithm>

#include "text/tokenizer_pipeline.hpp"
#include "text/tokenizer_unicode.hpp"

namespace swarm::tokenizer_detail {

// Where a stage hands its output (a non-owning reference to a callable).
class Sink {
 public:
  template <class F>
  explicit Sink(F& f) : obj_(&f), call_([](void* o, std::string_view s) { (*static_cast<F*>(o))(s); }) {}
  void operator()(std::string_view s) const { call_(obj_, s); }

 private:
  void* obj_;
  void (*call_)(void*, std::string_view);
};

struct DecodeState::Stage {
  virtual ~Stage() = default;
  /// Consumes one item (a token, or a chunk of text) and hands results to `next`.
  virtual void push(std::string_view item, const Sink& next) = 0;
  virtual void flush(const Sink& /*next*/) {}
};

namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

std::string replace_all_literal(std::string_view s, std::string_view pattern, std::string_view with) {
  std::string out;
  if (pattern.empty()) return std::string(s);
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(pattern, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(with);
    pos = hit + pattern.size();
  }
  out.append(s.substr(pos));
  return out;
}

std::string replace_all_regex(std::string_view s, const Regex& re, std::string_view with) {
  std::string out;
  size_t prev = 0;
  re.for_each_match(s, [&](size_t b, size_t e) {
    out.append(s.substr(prev, b - prev));
    out.append(with);
    prev = e;
  });
  out.append(s.substr(prev));
  return out;
}

// ---------------------------------------------------------------- token stages

class ReplaceTokenStage : public DecodeState::Stage {
 public:
  explicit ReplaceTokenStage(const DecoderStep& s) : step_(s) {}
  void push(std::string_view item, const Sink& next) override {
    next(step_.pattern ? replace_all_regex(item, *step_.pattern, step_.content)
                       : replace_all_literal(item, step_.pattern_literal, step_.content));
  }

 private:
  const DecoderStep& step_;
};

class StripTokenStage : public DecodeState::Stage {
 public:
  explicit StripTokenStage(const DecoderStep& s) : step_(s) {}
  void push(std::string_view item, const Sink& next) override {
    const std::string& c = step_.content;
    size_t begin = 0, end = item.size();
    for (size_t k = 0; k < step_.start && item.compare(begin, c.size(), c) == 0 && begin < end; ++k)
      begin += c.size();
    for (size_t k = 0;
         k < step_.stop && end >= begin + c.size() && item.compare(end - c.size(), c.size(), c) == 0; ++k)
      end -= c.size();
    next(item.substr(begin, end - begin));
  }

 private:
  const DecoderStep& step_;
};

// HF's Metaspace decoder: the replacement char becomes a space, except in the very first token
// where (unless prepend_scheme is "never") every one of them is dropped.
class MetaspaceTokenStage : public DecodeState::Stage {
 public:
  explicit MetaspaceTokenStage(const DecoderStep& s) : step_(s) {}
  void push(std::string_view item, const Sink& next) override {
    bool drop = first_ && step_.drop_first;
    first_ = false;
    next(replace_all_literal(item, step_.replacement, drop ? "" : " "));
  }

 private:
  const DecoderStep& step_;
  bool first_ = true;
};

// Consecutive <0xNN> tokens become the text of their bytes; a run that is not valid UTF-8
// becomes one U+FFFD per byte (HF's ByteFallback). The run is held until it ends.
class ByteFallbackStage : public DecodeState::Stage {
 public:
  void push(std::string_view item, const Sink& next) override {
    int byte = parse(item);
    if (byte >= 0) {
      run_ += static_cast<char>(byte);
      return;
    }
    emit_run(next);
    next(item);
  }
  void flush(const Sink& next) override { emit_run(next); }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static int parse(std::string_view t) {
    if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return -1;
    int hi = hex(t[3]), lo = hex(t[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }
  void emit_run(const Sink& next) {
    if (run_.empty()) return;
    if (unicode::is_valid_utf8(run_)) {
      next(run_);
    } else {
      std::string bad;
      for (size_t i = 0; i < run_.size(); ++i) bad += kReplacementChar;
      next(bad);
    }
    run_.clear();
  }
  std::string run_;
};

// Tokens -> bytes (a token whose characters are all in the byte alphabet stands for those
// bytes, any other for its own UTF-8) -> text, invalid sequences as U+FFFD like Rust's
// from_utf8_lossy; an unfinished sequence at the end waits for the next token.
class ByteLevelStage : public DecodeState::Stage {
 public:
  void push(std::string_view item, const Sink& next) override {
    if (auto bytes = byte_level_to_bytes(item))
      pending_ += *bytes;
    else
      pending_.append(item);
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
      size_t bad = 0;
      size_t n = unicode::valid_sequence_length(pending_, i, &bad);
      if (n > 0) {
        out.append(pending_, i, n);
        i += n;
        continue;
      }
      auto lead = static_cast<unsigned char>(pending_[i]);
      if (lead >= 0xC2 && lead <= 0xF4 && i + bad == pending_.size()) break;  // may complete
      out += kReplacementChar;
      i += bad;
    }
    pending_.erase(0, i);
    if (!out.empty()) next(out);
  }
  void flush(const Sink& next) override {
    if (pending_.empty()) return;
    std::string out;
    unicode::append_lossy(out, pending_);
    pending_.clear();
    next(out);
  }

 private:
  std::string pending_;
};

class PassStage : public DecodeState::Stage {
 public:
  void push(std::string_view item, const Sink& next) override { next(item); }
};

// No decoder at all: HF joins the tokens with spaces.
class JoinWithSpacesStage : public DecodeState::Stage {
 public:
  void push(std::string_view item, const Sink& next) override {
    if (!first_) next(" ");
    first_ = false;
    next(item);
  }

 private:
  bool first_ = true;
};

// ---------------------------------------------------------------- text stages

class ReplaceTextStage : public DecodeState::Stage {
 public:
  explicit ReplaceTextStage(const DecoderStep& s) : step_(s) {}
  void push(std::string_view item, const Sink& next) override {
    held_.append(item);
    const std::string& p = step_.pattern_literal;
    std::string out;
    size_t pos = 0;
    while (true) {
      size_t hit = held_.find(p, pos);
      if (hit == std::string::npos) break;
      out.append(held_, pos, hit - pos);
      out += step_.content;
      pos = hit + p.size();
    }
    // Keep the longest tail that could still become the pattern.
    size_t keep = 0;
    for (size_t k = std::min(p.size() - 1, held_.size() - pos); k > 0; --k)
      if (held_.compare(held_.size() - k, k, p, 0, k) == 0) {
        keep = k;
        break;
      }
    out.append(held_, pos, held_.size() - pos - keep);
    held_.erase(0, held_.size() - keep);
    if (!out.empty()) next(out);
  }
  void flush(const Sink& next) override {
    if (!held_.empty()) next(held_);
    held_.clear();
  }

 private:
  const DecoderStep& step_;
  std::string held_;
};

class StripTextStage : public DecodeState::Stage {
 public:
  explicit StripTextStage(const DecoderStep& s) : step_(s) {}
  void push(std::string_view item, const Sink& next) override {
    const std::string& c = step_.content;
    while (stripped_ < step_.start && !started_ && item.substr(0, c.size()) == c) {
      item.remove_prefix(c.size());
      ++stripped_;
    }
    if (!item.empty() || stripped_ >= step_.start) started_ = true;
    if (step_.stop == 0) {
      if (!item.empty()) next(item);
      return;
    }
    tail_.append(item);
    // Hold back up to `stop` trailing copies of the content.
    size_t end = tail_.size(), run = 0;
    while (run < step_.stop && end >= c.size() && tail_.compare(end - c.size(), c.size(), c) == 0) {
      end -= c.size();
      ++run;
    }
    if (end > 0) next(std::string_view(tail_).substr(0, end));
    tail_.erase(0, end);
  }
  void flush(const Sink& /*next*/) override { tail_.clear(); }

 private:
  const DecoderStep& step_;
  size_t stripped_ = 0;
  bool started_ = false;
  std::string tail_;
};

class MetaspaceTextStage : public DecodeState::Stage {
 public:
  explicit MetaspaceTextStage(const DecoderStep& s) : step_(s) {}
  void push(std::string_view item, const Sink& next) override {
    next(replace_all_literal(item, step_.replacement, step_.drop_first ? "" : " "));
  }

 private:
  const DecoderStep& step_;
};

// transformers' clean_up_tokenization: " ." -> "." etc., applied in its order. Text is released
// up to a point whose previous character occurs in no pattern: no replacement can span it.
class CleanupStage : public DecodeState::Stage {
 public:
  void push(std::string_view item, const Sink& next) override {
    held_.append(item);
    size_t cut = held_.size();
    while (cut > 0) {
      bool boundary = cut == held_.size() || (static_cast<unsigned char>(held_[cut]) & 0xC0) != 0x80;
      if (boundary && std::string_view(" '.?!,ntmsver").find(held_[cut - 1]) == std::string_view::npos) break;
      --cut;
    }
    if (cut == 0) return;
    next(clean(std::string_view(held_).substr(0, cut)));
    held_.erase(0, cut);
  }
  void flush(const Sink& next) override {
    if (!held_.empty()) next(clean(held_));
    held_.clear();
  }

  static std::string clean(std::string_view text) {
    static const std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    std::string s(text);
    for (const auto& [from, to] : kRules) s = replace_all_literal(s, from, to);
    return s;
  }

 private:
  std::string held_;
};

}  // namespace

DecodeState::DecodeState(const TokenizerImpl& impl_, bool skip_special_tokens)
    : impl(impl_), skip_special(skip_special_tokens) {
  bool text = false;  // past the point where tokens became one text
  if (!impl.has_decoder) {
    stages.push_back(std::make_unique<JoinWithSpacesStage>());
    text = true;
  }
  for (const DecoderStep& step : impl.decoder) {
    using K = DecoderStep::Kind;
    switch (step.kind) {
      case K::REPLACE:
        if (text)
          stages.push_back(std::make_unique<ReplaceTextStage>(step));
        else
          stages.push_back(std::make_unique<ReplaceTokenStage>(step));
        break;
      case K::STRIP:
        if (text)
          stages.push_back(std::make_unique<StripTextStage>(step));
        else
          stages.push_back(std::make_unique<StripTokenStage>(step));
        break;
      case K::METASPACE:
        if (text)
          stages.push_back(std::make_unique<MetaspaceTextStage>(step));
        else
          stages.push_back(std::make_unique<MetaspaceTokenStage>(step));
        break;
      case K::BYTE_FALLBACK:
        stages.push_back(std::make_unique<ByteFallbackStage>());  // loader keeps it before Fuse
        break;
      case K::FUSE:
        text = true;
        break;
      case K::BYTE_LEVEL:
        stages.push_back(std::make_unique<ByteLevelStage>());
        text = true;
        break;
    }
  }
  if (impl.clean_up_tokenization_spaces) stages.push_back(std::make_unique<CleanupStage>());
}

DecodeState::~DecodeState() = default;

namespace {

void feed(DecodeState& st, size_t stage, std::string_view item, std::string& out) {
  if (stage == st.stages.size()) {
    out.append(item);
    return;
  }
  auto next = [&](std::string_view piece) { feed(st, stage + 1, piece, out); };
  st.stages[stage]->push(item, Sink(next));
}

}  // namespace

void DecodeState::push(Id id, std::string& out) {
  const std::string* token = impl.decodable(id, skip_special);
  if (token == nullptr) return;
  feed(*this, 0, *token, out);
}

void DecodeState::flush(std::string& out) {
  for (size_t i = 0; i < stages.size(); ++i) {
    auto next = [&](std::string_view piece) { feed(*this, i + 1, piece, out); };
    stages[i]->flush(Sink(next));
  }
}

}  // namespace swarm::tokenizer_detail
