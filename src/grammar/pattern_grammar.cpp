#include "grammar/pattern_grammar.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/utf8.hpp"

namespace swarm::grammar {
namespace {

using Seq = std::vector<Element>;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points: sorted, disjoint, merged
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.emplace_back(lo, hi);
  }
  return out;
}

// Every code point (surrogates excluded: they are not characters in UTF-8) not in `r`.
Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalized(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  Ranges without_surrogates;
  for (const auto& [lo, hi] : out) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      without_surrogates.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) without_surrogates.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) without_surrogates.emplace_back(0xE000, hi);
  }
  return without_surrogates;
}

// The code point at s[i] (well-formed UTF-8 only), advancing i; i unchanged when malformed.
uint32_t utf8_decode(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  int n;
  uint32_t cp;
  if (c < 0x80) {
    ++i;
    return c;
  } else if (c >= 0xC2 && c <= 0xDF) {
    n = 1, cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 2, cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 3, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + static_cast<size_t>(n) >= s.size()) return 0;
  for (int k = 1; k <= n; ++k) {
    if ((b(i + static_cast<size_t>(k)) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + static_cast<size_t>(k)) & 0x3F);
  }
  const uint32_t min = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
  if (cp < min || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  i += static_cast<size_t>(n) + 1;
  return cp;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript's WhiteSpace and LineTerminator.
const Ranges kSpace = normalized({{0x09, 0x0D},
                                  {0x20, 0x20},
                                  {0xA0, 0xA0},
                                  {0x1680, 0x1680},
                                  {0x2000, 0x200A},
                                  {0x2028, 0x2029},
                                  {0x202F, 0x202F},
                                  {0x205F, 0x205F},
                                  {0x3000, 0x3000},
                                  {0xFEFF, 0xFEFF}});
const Ranges kDot = complement({{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}});

struct Node {
  enum Kind : uint8_t { SET, CAT, ALT, REPEAT, START, END } kind = CAT;
  Ranges set;
  std::vector<Node> kids;
  int64_t min = 0, max = -1;  // REPEAT; max -1: unbounded

  static Node of(Kind k) {
    Node n;
    n.kind = k;
    return n;
  }

  bool nullable() const {
    switch (kind) {
      case SET:
        return false;
      case CAT:
        return std::all_of(kids.begin(), kids.end(), [](const Node& k) { return k.nullable(); });
      case ALT:
        return std::any_of(kids.begin(), kids.end(), [](const Node& k) { return k.nullable(); });
      case REPEAT:
        return min == 0 || kids[0].nullable();
      default:
        return true;
    }
  }
  bool has_anchor() const {
    if (kind == START || kind == END) return true;
    return std::any_of(kids.begin(), kids.end(), [](const Node& k) { return k.has_anchor(); });
  }
};

class Parser {
 public:
  Parser(std::string_view pattern, const PatternLimits& limits) : text_(pattern), limits_(limits) {
    size_t i = 0;
    while (i < pattern.size()) {
      const size_t start = i;
      const uint32_t cp = utf8_decode(pattern, i);
      if (i == start) throw PatternError("'pattern' is not valid UTF-8");
      cps_.push_back(cp);
      offsets_.push_back(start);
    }
    offsets_.push_back(pattern.size());
  }

  Node parse() {
    Node n = alternation();
    if (pos_ < cps_.size()) fail("unbalanced ')'");
    return n;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw PatternError("'pattern' " + what + " at offset " +
                       std::to_string(offsets_[std::min(pos_, cps_.size())]) + " is not supported");
  }
  bool at_end() const { return pos_ >= cps_.size(); }
  uint32_t peek(size_t ahead = 0) const {
    return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0xFFFFFFFFu;
  }
  uint32_t take() { return cps_[pos_++]; }

  Node alternation() {
    Node alt = Node::of(Node::ALT);
    alt.kids.push_back(sequence());
    while (!at_end() && peek() == '|') {
      take();
      alt.kids.push_back(sequence());
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Node sequence() {
    Node cat = Node::of(Node::CAT);
    while (!at_end() && peek() != '|' && peek() != ')') cat.kids.push_back(quantified());
    return cat;
  }

  // {m}, {m,}, {m,n} at the current position: the bounds, or nothing (then '{' is a literal).
  bool braces(int64_t& lo, int64_t& hi) {
    size_t p = pos_ + 1;
    auto number = [&](int64_t& v) {
      const size_t start = p;
      v = 0;
      while (p < cps_.size() && cps_[p] >= '0' && cps_[p] <= '9') {
        if (v < 1'000'000) v = v * 10 + (cps_[p] - '0');
        ++p;
      }
      return p > start;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (p < cps_.size() && cps_[p] == ',') {
      ++p;
      if (!number(hi)) hi = -1;
    }
    if (p >= cps_.size() || cps_[p] != '}') return false;
    pos_ = p + 1;
    return true;
  }

  bool quantifier(int64_t& lo, int64_t& hi) {
    if (at_end()) return false;
    switch (peek()) {
      case '*':
        take();
        lo = 0, hi = -1;
        return true;
      case '+':
        take();
        lo = 1, hi = -1;
        return true;
      case '?':
        take();
        lo = 0, hi = 1;
        return true;
      case '{':
        return braces(lo, hi);
      default:
        return false;
    }
  }

  Node quantified() {
    Node a = atom();
    int64_t lo = 0, hi = 0;
    if (!quantifier(lo, hi)) return a;
    if (a.kind == Node::START || a.kind == Node::END) fail("a quantifier on an anchor");
    if (hi >= 0 && hi < lo) fail("a quantifier {m,n} with n < m");
    if (lo > limits_.max_repeat || hi > limits_.max_repeat)
      fail("a repeat count above " + std::to_string(limits_.max_repeat));
    if (!at_end() && peek() == '?') take();  // lazy: the same language
    int64_t lo2 = 0, hi2 = 0;
    const size_t before = pos_;
    if (quantifier(lo2, hi2)) {
      pos_ = before;
      fail("a quantifier after a quantifier");
    }
    Node r = Node::of(Node::REPEAT);
    r.min = lo;
    r.max = hi;
    r.kids.push_back(std::move(a));
    return r;
  }

  Node set_node(Ranges r) {
    Node n = Node::of(Node::SET);
    n.set = normalized(std::move(r));
    if (n.set.empty()) fail("a class that matches nothing");
    return n;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const uint32_t c = at_end() ? 0 : take();
      int d;
      if (c >= '0' && c <= '9')
        d = static_cast<int>(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = static_cast<int>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = static_cast<int>(c - 'A' + 10);
      else
        fail("a malformed hex escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  // After a backslash: a class escape (\d ...) as `set`, or one character. `in_class`: \b is a
  // backspace there, a word boundary outside.
  bool escape(Ranges& set, uint32_t& cp, bool in_class) {
    if (at_end()) fail("a trailing backslash");
    const uint32_t c = take();
    switch (c) {
      case 'd':
        set = kDigit;
        return true;
      case 'D':
        set = complement(kDigit);
        return true;
      case 'w':
        set = kWord;
        return true;
      case 'W':
        set = complement(kWord);
        return true;
      case 's':
        set = kSpace;
        return true;
      case 'S':
        set = complement(kSpace);
        return true;
      case 't':
        cp = '\t';
        return false;
      case 'n':
        cp = '\n';
        return false;
      case 'r':
        cp = '\r';
        return false;
      case 'f':
        cp = '\f';
        return false;
      case 'v':
        cp = '\v';
        return false;
      case 'x':
        cp = hex(2);
        return false;
      case 'u': {
        cp = hex(4);
        if (cp >= 0xD800 && cp <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
          pos_ += 2;
          const uint32_t low = hex(4);
          if (low < 0xDC00 || low > 0xDFFF) fail("an unpaired surrogate escape");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        } else if (cp >= 0xD800 && cp <= 0xDFFF) {
          fail("an unpaired surrogate escape");
        }
        return false;
      }
      case '0':
        if (!at_end() && peek() >= '0' && peek() <= '9') fail("an octal escape");
        cp = 0;
        return false;
      case 'b':
        if (in_class) {
          cp = 0x08;
          return false;
        }
        fail("the word boundary \\b");
      case 'B':
        fail("the word boundary \\B");
      case 'p':
      case 'P':
        fail("a Unicode property escape \\" + std::string(1, static_cast<char>(c)));
      case 'k':
        fail("a named backreference \\k");
      case 'c':
        fail("a control escape \\c");
      default:
        break;
    }
    if (c >= '1' && c <= '9') fail("a backreference \\" + std::string(1, static_cast<char>(c)));
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      fail("the escape \\" + std::string(1, static_cast<char>(c)));
    cp = c;  // escaped punctuation stands for itself
    return false;
  }

  Node char_class() {
    bool negate = false;
    if (peek() == '^') {
      take();
      negate = true;
    }
    Ranges set;
    bool first = true;
    while (true) {
      if (at_end()) fail("an unterminated character class");
      if (peek() == ']' && !first) {
        take();
        break;
      }
      if (peek() == ']' && first) {  // [] matches nothing, [^] anything
        take();
        if (!negate) fail("the empty class []");
        break;
      }
      first = false;
      Ranges item;
      uint32_t lo = 0;
      bool is_set = false;
      if (peek() == '\\') {
        take();
        is_set = escape(item, lo, true);
      } else {
        lo = take();
      }
      if (is_set) {
        set.insert(set.end(), item.begin(), item.end());
        if (peek() == '-' && peek(1) != ']' && !at_end()) fail("a range from a class escape");
        continue;
      }
      if (peek() == '-' && pos_ + 1 < cps_.size() && peek(1) != ']') {
        take();
        uint32_t hi = 0;
        if (peek() == '\\') {
          take();
          if (escape(item, hi, true)) fail("a range to a class escape");
        } else {
          hi = take();
        }
        if (hi < lo) fail("a range out of order");
        set.emplace_back(lo, hi);
      } else {
        set.emplace_back(lo, lo);
      }
    }
    return set_node(negate ? complement(set) : set);
  }

  Node atom() {
    const uint32_t c = take();
    switch (c) {
      case '(': {
        if (peek() == '?') {
          if (peek(1) == ':') {
            pos_ += 2;
          } else if (peek(1) == '<' && peek(2) != '=' && peek(2) != '!') {
            pos_ += 2;
            while (!at_end() && peek() != '>') take();
            if (at_end()) fail("an unterminated group name");
            take();
          } else {
            fail("lookaround (?" + std::string(1, static_cast<char>(peek(1))));
          }
        }
        if (++depth_ > kMaxGroupDepth) fail("groups nested deeper than " + std::to_string(kMaxGroupDepth));
        Node inner = alternation();
        --depth_;
        if (at_end() || peek() != ')') fail("an unterminated group");
        take();
        return inner;
      }
      case ')':
        --pos_;
        fail("unbalanced ')'");
      case '[':
        return char_class();
      case '.':
        return set_node(kDot);
      case '^':
        return Node::of(Node::START);
      case '$':
        return Node::of(Node::END);
      case '*':
      case '+':
      case '?':
        --pos_;
        fail("a quantifier with nothing to repeat");
      case '\\': {
        Ranges set;
        uint32_t cp = 0;
        if (escape(set, cp, false)) return set_node(set);
        return set_node({{cp, cp}});
      }
      case '{': {
        int64_t lo = 0, hi = 0;
        --pos_;
        if (braces(lo, hi)) fail("a quantifier with nothing to repeat");
        take();
        return set_node({{c, c}});
      }
      default:
        return set_node({{c, c}});
    }
  }

  // Parsing, compiling and freeing recurse once per group: bounded, whatever the pattern.
  static constexpr int kMaxGroupDepth = 32;
  int depth_ = 0;
  std::string_view text_;
  PatternLimits limits_;
  std::vector<uint32_t> cps_;
  std::vector<size_t> offsets_;
  size_t pos_ = 0;
};

class Compiler {
 public:
  Compiler(Grammar& g, const std::function<void()>& check_size) : g_(g), check_size_(check_size) {}

  Seq compile(const Node& n) {
    switch (n.kind) {
      case Node::SET:
        return {Element::rule(set_rule(n.set))};
      case Node::CAT: {
        Seq out;
        for (const Node& k : n.kids) {
          const Seq s = compile(k);
          out.insert(out.end(), s.begin(), s.end());
        }
        return out;
      }
      case Node::ALT: {
        std::vector<Seq> alts;
        for (const Node& k : n.kids) alts.push_back(compile(k));
        check_size_();
        return {Element::rule(g_.rule_of(alts))};
      }
      case Node::REPEAT: {
        const uint32_t item = g_.rule_of({compile(n.kids[0])});
        Seq out;
        for (int64_t i = 0; i < n.min; ++i) out.push_back(Element::rule(item));
        uint32_t more;
        if (n.max < 0) {
          if (n.kids[0].nullable())
            throw PatternError("'pattern' has an unbounded repeat of what can be empty");
          more = g_.add_rule();
          g_.add_alternative(more, {});
          g_.add_alternative(more, {Element::rule(item), Element::rule(more)});
        } else {
          more = g_.rule_of({{}});
          for (int64_t i = n.min; i < n.max; ++i)
            more = g_.rule_of({{}, {Element::rule(item), Element::rule(more)}});
        }
        out.push_back(Element::rule(more));
        check_size_();
        return out;
      }
      default:
        throw PatternError("'pattern' has an anchor (^ or $) inside it, which is not supported");
    }
  }

 private:
  // One character of the set as a JSON string spells it.
  uint32_t set_rule(const Ranges& set) {
    if (auto it = set_rules_.find(set); it != set_rules_.end()) return it->second;
    std::vector<Seq> alts;
    for (auto [lo, hi] : set) {
      // Characters JSON escapes, each with its one spelling.
      for (; lo <= hi && lo < 0x20; ++lo) alts.push_back(Grammar::literal(escaped(lo)));
      for (uint32_t special : {uint32_t{'"'}, uint32_t{'\\'}}) {
        if (lo > hi || special < lo || special > hi) continue;
        if (special > lo) utf8_ranges(lo, special - 1, alts);
        alts.push_back(Grammar::literal(escaped(special)));
        lo = special + 1;
      }
      if (lo <= hi) utf8_ranges(lo, hi, alts);
    }
    const uint32_t r = g_.rule_of(alts);
    check_size_();
    set_rules_[set] = r;
    return r;
  }

  static std::string escaped(uint32_t c) {
    switch (c) {
      case '"':
        return "\\\"";
      case '\\':
        return "\\\\";
      case 0x08:
        return "\\b";
      case 0x0C:
        return "\\f";
      case 0x0A:
        return "\\n";
      case 0x0D:
        return "\\r";
      case 0x09:
        return "\\t";
      default: {
        static const char* kHex = "0123456789abcdef";
        return std::string("\\u00") + kHex[c >> 4] + kHex[c & 15];
      }
    }
  }

  static std::string encode(uint32_t cp) {
    std::string s;
    append_utf8(s, cp);
    return s;
  }

  // The UTF-8 encodings of the code points lo..hi (no surrogates) as sequences of byte ranges.
  static void utf8_ranges(uint32_t lo, uint32_t hi, std::vector<Seq>& out) {
    if (lo > hi) return;
    if (lo <= 0xDFFF && hi >= 0xD800) {  // never encode surrogates
      if (lo < 0xD800) utf8_ranges(lo, 0xD7FF, out);
      if (hi > 0xDFFF) utf8_ranges(0xE000, hi, out);
      return;
    }
    for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu})  // one encoded length at a time
      if (lo <= boundary && hi > boundary) {
        utf8_ranges(lo, boundary, out);
        utf8_ranges(boundary + 1, hi, out);
        return;
      }
    if (hi < 0x80) {
      out.push_back({Element::bytes(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi))});
      return;
    }
    // Split until the continuation bytes below the first differing one span their full range.
    const int n = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < n; ++i) {
      const uint32_t m = (1u << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          utf8_ranges(lo, lo | m, out);
          utf8_ranges((lo | m) + 1, hi, out);
          return;
        }
        if ((hi & m) != m) {
          utf8_ranges(lo, (hi & ~m) - 1, out);
          utf8_ranges(hi & ~m, hi, out);
          return;
        }
      }
    }
    const std::string a = encode(lo), b = encode(hi);
    Seq seq;
    for (size_t i = 0; i < a.size(); ++i)
      seq.push_back(Element::bytes(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])));
    out.push_back(seq);
  }

  Grammar& g_;
  const std::function<void()>& check_size_;
  std::map<Ranges, uint32_t> set_rules_;
};

}  // namespace

uint32_t pattern_rule(Grammar& g, std::string_view pattern, uint32_t any_chars, const PatternLimits& limits,
                      const std::function<void()>& check_size) {
  const Node root = Parser(pattern, limits).parse();
  Compiler c(g, check_size);
  std::vector<Seq> alts;
  const std::vector<Node> branches = root.kind == Node::ALT ? root.kids : std::vector<Node>{root};
  for (const Node& branch : branches) {
    std::vector<Node> parts = branch.kind == Node::CAT ? branch.kids : std::vector<Node>{branch};
    const bool anchored_start = !parts.empty() && parts.front().kind == Node::START;
    if (anchored_start) parts.erase(parts.begin());
    const bool anchored_end = !parts.empty() && parts.back().kind == Node::END;
    if (anchored_end) parts.pop_back();
    Node body = Node::of(Node::CAT);
    body.kids = std::move(parts);
    if (body.has_anchor())
      throw PatternError(
          "'pattern' has an anchor (^ or $) inside it, which is not supported (only at its ends)");
    Seq seq;
    if (!anchored_start) seq.push_back(Element::rule(any_chars));
    const Seq mid = c.compile(body);
    seq.insert(seq.end(), mid.begin(), mid.end());
    if (!anchored_end && (anchored_start || !mid.empty())) seq.push_back(Element::rule(any_chars));
    alts.push_back(seq);
  }
  check_size();
  return g.rule_of(alts);
}

}  // namespace swarm::grammar
