#include "text/jinja/parser.hpp"

#include <algorithm>
#include <initializer_list>
#include <string_view>

namespace swarm::jinja {

namespace {

using Names = std::initializer_list<std::string_view>;

template <class T>
std::unique_ptr<T> make_node(size_t offset) {
  auto n = std::make_unique<T>();
  n->offset = offset;
  return n;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_template() {
    Body body = subparse({});
    for (const auto& u : unknown_)
      if (!u.soft) throw Error(u.message, u.offset);
    return body;
  }

 private:
  // An unknown filter/test: an error unless it sits in a conditional branch.
  struct Unknown {
    std::string message;
    size_t offset;
    bool soft;
  };

  // ------------------------------------------------------------ token helpers
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& tk = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return tk;
  }
  bool is_op(std::string_view op) const { return cur().type == TokenType::OPERATOR && cur().value == op; }
  bool is_name(std::string_view n) const { return cur().type == TokenType::NAME && cur().value == n; }
  bool is_name_in(Names names) const {
    if (cur().type != TokenType::NAME) return false;
    for (auto n : names)
      if (cur().value == n) return true;
    return false;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& tk) {
    switch (tk.type) {
      case TokenType::NAME:
      case TokenType::OPERATOR:
        return "'" + tk.value + "'";
      case TokenType::STRING:
        return "string";
      case TokenType::INTEGER:
        return "integer";
      case TokenType::FLOAT:
        return "float";
      case TokenType::VAR_BEGIN:
        return "'{{'";
      case TokenType::VAR_END:
        return "'}}'";
      case TokenType::BLOCK_BEGIN:
        return "'{%'";
      case TokenType::BLOCK_END:
        return "'%}'";
      case TokenType::DATA:
        return "template data";
      case TokenType::END:
        return "end of template";
    }
    return "token";
  }

  [[noreturn]] void fail(const std::string& msg) const { throw Error(msg, cur().offset); }
  [[noreturn]] void fail_unexpected(const std::string& expected = "") const {
    std::string msg = "unexpected " + describe(cur());
    if (!expected.empty()) msg += ", expected " + expected;
    fail(msg);
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail_unexpected("'" + std::string(op) + "'");
  }
  std::string expect_name() {
    if (cur().type != TokenType::NAME) fail_unexpected("a name");
    return next().value;
  }
  void expect_name(std::string_view n) {
    if (!skip_name(n)) fail_unexpected("'" + std::string(n) + "'");
  }
  void expect_block_end() {
    if (cur().type != TokenType::BLOCK_END) fail_unexpected("end of statement block '%}'");
    next();
  }

  // ------------------------------------------------------------ template structure
  Body subparse(Names end_names) {
    DepthGuard depth(*this);
    Body body;
    while (true) {
      const Token& tk = cur();
      switch (tk.type) {
        case TokenType::END:
          if (end_names.size() != 0) {
            std::string expected;
            for (auto n : end_names) expected += (expected.empty() ? "'" : " or '") + std::string(n) + "'";
            fail("unexpected end of template, expected " + expected);
          }
          return body;
        case TokenType::DATA: {
          auto text = make_node<Text>(tk.offset);
          text->text = tk.value;
          body.push_back(std::move(text));
          next();
          break;
        }
        case TokenType::VAR_BEGIN: {
          auto print = make_node<Print>(tk.offset);
          next();
          print->expr = parse_tuple(false, true, {}, false);
          if (cur().type != TokenType::VAR_END) fail_unexpected("end of print statement '}}'");
          next();
          body.push_back(std::move(print));
          break;
        }
        case TokenType::BLOCK_BEGIN: {
          const Token& name = peek();
          if (name.type == TokenType::NAME && std::find(end_names.begin(), end_names.end(),
                                                        std::string_view(name.value)) != end_names.end()) {
            next();  // leave the end name as the current token for the caller
            return body;
          }
          next();
          parse_statement(body);
          break;
        }
        default:
          fail_unexpected();
      }
    }
  }

  void parse_statement(Body& out) {
    if (cur().type != TokenType::NAME) fail_unexpected("a statement name");
    const std::string& kw = cur().value;
    if (kw == "for") return out.push_back(parse_for());
    if (kw == "if") return out.push_back(parse_if());
    if (kw == "set") return out.push_back(parse_set());
    if (kw == "macro") return out.push_back(parse_macro());
    if (kw == "call") return out.push_back(parse_call_block());
    if (kw == "filter") return out.push_back(parse_filter_block());
    if (kw == "with") return out.push_back(parse_with());
    if (kw == "print") {
      auto print = make_node<Print>(cur().offset);
      next();
      print->expr = parse_tuple(false, true, {}, false);
      expect_block_end();
      return out.push_back(std::move(print));
    }
    if (kw == "break" || kw == "continue") {
      auto ctl = make_node<LoopControl>(cur().offset);
      ctl->is_break = kw == "break";
      if (loop_depth_ == 0) fail("'" + kw + "' outside of a loop");
      next();
      expect_block_end();
      return out.push_back(std::move(ctl));
    }
    if (kw == "generation") {
      // Hugging Face's {% generation %} marks assistant tokens; it renders its body unchanged.
      // Like Hugging Face's extension, the body is rendered in its own scope.
      auto block = make_node<FilterBlock>(cur().offset);
      next();
      expect_block_end();
      const int saved_soft = soft_;
      soft_ = 0;
      block->body = subparse({"endgeneration"});
      soft_ = saved_soft;
      next();
      expect_block_end();
      return out.push_back(std::move(block));
    }
    static const Names kUnsupported = {"block", "extends", "include", "import", "from", "autoescape", "do"};
    if (is_name_in(kUnsupported)) fail("unsupported tag '" + kw + "'");
    fail("unknown tag '" + kw + "'");
  }

  StmtPtr parse_for() {
    auto node = make_node<For>(cur().offset);
    next();
    node->target = parse_assign_target({"in"}, false);
    expect_name("in");
    node->iter = parse_tuple(false, false, {"recursive"}, false);
    const int saved_soft = soft_;
    soft_ = 0;
    if (skip_name("if")) node->filter = parse_expression(true);
    if (is_name("recursive")) fail("recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    node->body = subparse({"endfor", "else"});
    --loop_depth_;
    if (skip_name("else")) {
      expect_block_end();
      node->else_body = subparse({"endfor"});
    }
    soft_ = saved_soft;
    expect_name("endfor");
    expect_block_end();
    return node;
  }

  StmtPtr parse_if() {
    auto node = make_node<If>(cur().offset);
    next();
    ++soft_;
    while (true) {
      ExprPtr cond = parse_tuple(false, false, {}, false);
      expect_block_end();
      Body body = subparse({"elif", "else", "endif"});
      node->branches.emplace_back(std::move(cond), std::move(body));
      if (skip_name("elif")) continue;
      if (skip_name("else")) {
        expect_block_end();
        node->else_body = subparse({"endif"});
      }
      break;
    }
    --soft_;
    expect_name("endif");
    expect_block_end();
    return node;
  }

  StmtPtr parse_set() {
    const size_t offset = cur().offset;
    next();
    Target target = parse_assign_target({}, true);
    if (skip_op("=")) {
      auto node = make_node<Assign>(offset);
      node->target = std::move(target);
      node->value = parse_tuple(false, true, {}, false);
      expect_block_end();
      return node;
    }
    auto node = make_node<AssignBlock>(offset);
    node->target = std::move(target);
    if (is_op("|")) {
      next();
      node->filters = parse_filter_chain();
    }
    expect_block_end();
    const int saved_soft = soft_;
    soft_ = 0;
    node->body = subparse({"endset"});
    soft_ = saved_soft;
    next();
    expect_block_end();
    return node;
  }

  std::vector<Param> parse_signature() {
    std::vector<Param> params;
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      Param p;
      p.name = expect_name();
      if (skip_op("=")) {
        p.default_value = parse_expression(true);
      } else if (!params.empty() && params.back().default_value) {
        fail("non-default argument follows default argument");
      }
      params.push_back(std::move(p));
    }
    expect_op(")");
    return params;
  }

  StmtPtr parse_macro() {
    auto node = make_node<Macro>(cur().offset);
    next();
    node->name = expect_name();
    node->params = parse_signature();
    expect_block_end();
    const int saved_soft = soft_, saved_loop = loop_depth_;
    soft_ = 0;
    loop_depth_ = 0;
    macros_.push_back(node.get());
    node->body = subparse({"endmacro"});
    macros_.pop_back();
    soft_ = saved_soft;
    loop_depth_ = saved_loop;
    next();
    expect_block_end();
    return node;
  }

  StmtPtr parse_call_block() {
    auto node = make_node<CallBlock>(cur().offset);
    next();
    if (is_op("(")) node->caller_params = parse_signature();
    ExprPtr e = parse_expression(true);
    if (!dynamic_cast<Call*>(e.get())) throw Error("expected a macro call after 'call'", e->offset);
    node->call.reset(static_cast<Call*>(e.release()));
    expect_block_end();
    const int saved_soft = soft_, saved_loop = loop_depth_;
    soft_ = 0;
    loop_depth_ = 0;
    node->body = subparse({"endcall"});
    soft_ = saved_soft;
    loop_depth_ = saved_loop;
    next();
    expect_block_end();
    return node;
  }

  StmtPtr parse_filter_block() {
    auto node = make_node<FilterBlock>(cur().offset);
    next();
    node->filters = parse_filter_chain();
    expect_block_end();
    const int saved_soft = soft_;
    soft_ = 0;
    node->body = subparse({"endfilter"});
    soft_ = saved_soft;
    next();
    expect_block_end();
    return node;
  }

  StmtPtr parse_with() {
    auto node = make_node<With>(cur().offset);
    next();
    while (cur().type != TokenType::BLOCK_END) {
      if (!node->assignments.empty()) expect_op(",");
      Target target = parse_assign_target({}, false);
      expect_op("=");
      node->assignments.emplace_back(std::move(target), parse_expression(true));
    }
    expect_block_end();
    node->body = subparse({"endwith"});
    next();
    expect_block_end();
    return node;
  }

  // ------------------------------------------------------------ assignment targets
  Target parse_assign_target(Names extra_end, bool with_namespace) {
    if (with_namespace && cur().type == TokenType::NAME && peek().type == TokenType::OPERATOR &&
        peek().value == ".") {
      Target t;
      t.kind = Target::Kind::ATTR;
      t.offset = cur().offset;
      t.name = next().value;
      next();
      t.attr = expect_name();
      return t;
    }
    Target first = parse_target_atom();
    if (!is_op(",")) return first;
    Target tuple;
    tuple.kind = Target::Kind::TUPLE;
    tuple.offset = first.offset;
    tuple.items.push_back(std::move(first));
    while (skip_op(",")) {
      if (is_name_in(extra_end) || is_op("=") || is_op(")") || cur().type == TokenType::BLOCK_END) break;
      tuple.items.push_back(parse_target_atom());
    }
    return tuple;
  }

  Target parse_target_atom() {
    if (skip_op("(")) {
      Target t = parse_assign_target({}, false);
      expect_op(")");
      return t;
    }
    if (cur().type != TokenType::NAME) fail("can't assign to " + describe(cur()));
    static const Names kReserved = {"true", "false", "none", "True", "False", "None"};
    if (is_name_in(kReserved)) fail("can't assign to " + describe(cur()));
    Target t;
    t.offset = cur().offset;
    t.name = next().value;
    return t;
  }

  // ------------------------------------------------------------ expressions
  bool is_tuple_end(Names extra_end) const {
    const auto type = cur().type;
    if (type == TokenType::VAR_END || type == TokenType::BLOCK_END || type == TokenType::END) return true;
    if (is_op(")")) return true;
    return is_name_in(extra_end);
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, Names extra_end, bool explicit_parens) {
    const size_t offset = cur().offset;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      if (simplified)
        items.push_back(parse_primary());
      else
        items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
    }
    auto node = make_node<ListExpr>(offset);
    node->items = std::move(items);
    node->tuple = true;
    return node;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    const size_t mark = unknown_.size();
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      auto node = make_node<CondExpr>(cur().offset);
      next();
      node->test = parse_or();
      if (skip_name("else")) node->otherwise = parse_condexpr();
      node->then = std::move(expr);
      expr = std::move(node);
      // Jinja resolves filters/tests of conditional expressions at run time.
      for (size_t k = mark; k < unknown_.size(); ++k) unknown_[k].soft = true;
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto node = make_node<Logical>(cur().offset);
      next();
      node->is_and = false;
      node->left = std::move(left);
      node->right = parse_and();
      left = std::move(node);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto node = make_node<Logical>(cur().offset);
      next();
      node->is_and = true;
      node->left = std::move(left);
      node->right = parse_not();
      left = std::move(node);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto node = make_node<Unary>(cur().offset);
      next();
      node->op = UnaryOp::NOT;
      node->operand = parse_not();
      return node;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const size_t offset = cur().offset;
    ExprPtr first = parse_math1();
    std::vector<std::pair<CompareOp, ExprPtr>> rest;
    while (true) {
      CompareOp op;
      if (cur().type == TokenType::OPERATOR &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == "<=" ||
           cur().value == ">" || cur().value == ">=")) {
        const std::string& v = cur().value;
        op = v == "=="   ? CompareOp::EQ
             : v == "!=" ? CompareOp::NE
             : v == "<"  ? CompareOp::LT
             : v == "<=" ? CompareOp::LE
             : v == ">"  ? CompareOp::GT
                         : CompareOp::GE;
        next();
      } else if (is_name("in")) {
        op = CompareOp::IN;
        next();
      } else if (is_name("not") && peek().type == TokenType::NAME && peek().value == "in") {
        op = CompareOp::NOT_IN;
        next();
        next();
      } else {
        break;
      }
      rest.emplace_back(op, parse_math1());
    }
    if (rest.empty()) return first;
    auto node = make_node<Compare>(offset);
    node->first = std::move(first);
    node->rest = std::move(rest);
    return node;
  }

  ExprPtr make_binary(BinaryOp op, size_t offset, ExprPtr left, ExprPtr right) {
    auto node = make_node<Binary>(offset);
    node->op = op;
    node->left = std::move(left);
    node->right = std::move(right);
    return node;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const BinaryOp op = cur().value == "+" ? BinaryOp::ADD : BinaryOp::SUB;
      const size_t offset = next().offset;
      left = make_binary(op, offset, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const size_t offset = next().offset;
      left = make_binary(BinaryOp::CONCAT, offset, std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string& v = cur().value;
      const BinaryOp op = v == "*"    ? BinaryOp::MUL
                          : v == "/"  ? BinaryOp::DIV
                          : v == "//" ? BinaryOp::FLOORDIV
                                      : BinaryOp::MOD;
      const size_t offset = next().offset;
      left = make_binary(op, offset, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const size_t offset = next().offset;
      left = make_binary(BinaryOp::POW, offset, std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard depth(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto u = make_node<Unary>(cur().offset);
      u->op = cur().value == "-" ? UnaryOp::NEG : UnaryOp::POS;
      next();
      u->operand = parse_unary(false);
      node = std::move(u);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    switch (tk.type) {
      case TokenType::NAME: {
        const std::string& n = tk.value;
        if (n == "true" || n == "True" || n == "false" || n == "False") {
          auto lit = make_node<Literal>(tk.offset);
          lit->value = Value::boolean(n == "true" || n == "True");
          next();
          return lit;
        }
        if (n == "none" || n == "None") {
          auto lit = make_node<Literal>(tk.offset);
          lit->value = Value::none();
          next();
          return lit;
        }
        auto name = make_node<Name>(tk.offset);
        name->name = n;
        for (Macro* m : macros_) {
          if (n == "varargs") m->uses_varargs = true;
          if (n == "kwargs") m->uses_kwargs = true;
          if (n == "caller") m->uses_caller = true;
        }
        next();
        return name;
      }
      case TokenType::STRING: {
        auto lit = make_node<Literal>(tk.offset);
        std::string s;
        while (cur().type == TokenType::STRING) s += next().value;
        lit->value = Value::string(std::move(s));
        return lit;
      }
      case TokenType::INTEGER: {
        auto lit = make_node<Literal>(tk.offset);
        lit->value = Value::integer(tk.int_value);
        next();
        return lit;
      }
      case TokenType::FLOAT: {
        auto lit = make_node<Literal>(tk.offset);
        lit->value = Value::number(tk.float_value);
        next();
        return lit;
      }
      case TokenType::OPERATOR:
        if (tk.value == "(") {
          next();
          ExprPtr e = parse_tuple(false, true, {}, true);
          expect_op(")");
          return e;
        }
        if (tk.value == "[") return parse_list();
        if (tk.value == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail_unexpected();
  }

  ExprPtr parse_list() {
    auto node = make_node<ListExpr>(cur().offset);
    expect_op("[");
    while (!is_op("]")) {
      if (!node->items.empty()) expect_op(",");
      if (is_op("]")) break;
      node->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return node;
  }

  ExprPtr parse_dict() {
    auto node = make_node<DictExpr>(cur().offset);
    expect_op("{");
    while (!is_op("}")) {
      if (!node->items.empty()) expect_op(",");
      if (is_op("}")) break;
      ExprPtr key = parse_expression(true);
      expect_op(":");
      node->items.emplace_back(std::move(key), parse_expression(true));
    }
    expect_op("}");
    return node;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        next();
        node = parse_filter(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& tk = next();
    if (tk.value == ".") {
      const Token& attr = cur();
      if (attr.type == TokenType::NAME) {
        auto ga = make_node<GetAttr>(attr.offset);
        ga->object = std::move(node);
        ga->name = attr.value;
        next();
        return ga;
      }
      if (attr.type == TokenType::INTEGER) {
        auto gi = make_node<GetItem>(attr.offset);
        gi->object = std::move(node);
        auto lit = make_node<Literal>(attr.offset);
        lit->value = Value::integer(attr.int_value);
        gi->key = std::move(lit);
        next();
        return gi;
      }
      fail_unexpected("an attribute name");
    }
    // '['
    const size_t offset = tk.offset;
    std::vector<ExprPtr> keys;
    std::unique_ptr<SliceExpr> slice;
    while (!is_op("]")) {
      if (!keys.empty() || slice) expect_op(",");
      if (slice) fail("slices inside tuple subscripts are not supported");
      ExprPtr first;
      if (!is_op(":")) {
        first = parse_expression(true);
        if (!is_op(":")) {
          keys.push_back(std::move(first));
          continue;
        }
      }
      if (!keys.empty()) fail("slices inside tuple subscripts are not supported");
      next();  // ':'
      slice = make_node<SliceExpr>(offset);
      slice->start = std::move(first);
      if (!is_op(":") && !is_op("]") && !is_op(",")) slice->stop = parse_expression(true);
      if (skip_op(":")) {
        if (!is_op("]") && !is_op(",")) slice->step = parse_expression(true);
      }
    }
    expect_op("]");
    if (slice) {
      slice->object = std::move(node);
      return slice;
    }
    if (keys.empty()) throw Error("expected a subscript", offset);
    auto gi = make_node<GetItem>(offset);
    gi->object = std::move(node);
    if (keys.size() == 1) {
      gi->key = std::move(keys[0]);
    } else {
      auto tuple = make_node<ListExpr>(offset);
      tuple->tuple = true;
      tuple->items = std::move(keys);
      gi->key = std::move(tuple);
    }
    return gi;
  }

  void parse_call_args(std::vector<ExprPtr>& args, std::vector<KeywordArg>& kwargs) {
    expect_op("(");
    while (!is_op(")")) {
      if (!args.empty() || !kwargs.empty()) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == TokenType::NAME && peek().type == TokenType::OPERATOR && peek().value == "=") {
        KeywordArg kw;
        kw.name = next().value;
        next();
        kw.value = parse_expression(true);
        kwargs.push_back(std::move(kw));
      } else {
        if (!kwargs.empty()) fail("positional argument follows keyword argument");
        args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto node = make_node<Call>(callee->offset);  // errors point at the callee
    node->callee = std::move(callee);
    parse_call_args(node->args, node->kwargs);
    return node;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (is_op(".")) {
      next();
      name += "." + expect_name();
    }
    return name;
  }

  std::unique_ptr<FilterExpr> parse_one_filter(ExprPtr input) {
    auto node = make_node<FilterExpr>(cur().offset);
    node->input = std::move(input);
    node->name = parse_dotted_name();
    node->fn = find_filter(node->name);
    if (!node->fn) unknown_.push_back({"unknown filter '" + node->name + "'", node->offset, soft_ > 0});
    if (is_op("(")) parse_call_args(node->args, node->kwargs);
    return node;
  }

  ExprPtr parse_filter(ExprPtr input) { return parse_one_filter(std::move(input)); }

  // `f(args) | g | h` with no input (filter blocks, block sets).
  std::vector<std::unique_ptr<FilterExpr>> parse_filter_chain() {
    std::vector<std::unique_ptr<FilterExpr>> chain;
    chain.push_back(parse_one_filter(nullptr));
    while (skip_op("|")) chain.push_back(parse_one_filter(nullptr));
    return chain;
  }

  ExprPtr parse_test(ExprPtr input) {
    auto node = make_node<TestExpr>(cur().offset);
    next();  // 'is'
    node->input = std::move(input);
    node->negated = skip_name("not");
    node->name = parse_dotted_name();
    node->fn = find_test(node->name);
    if (!node->fn) unknown_.push_back({"unknown test '" + node->name + "'", node->offset, soft_ > 0});
    const auto type = cur().type;
    if (is_op("(")) {
      parse_call_args(node->args, node->kwargs);
    } else if ((type == TokenType::NAME || type == TokenType::STRING || type == TokenType::INTEGER ||
                type == TokenType::FLOAT || is_op("[") || is_op("{")) &&
               !is_name_in({"else", "or", "and"})) {
      if (is_name("is")) fail("you cannot chain multiple tests with 'is'");
      ExprPtr arg = parse_postfix(parse_primary());
      node->args.push_back(std::move(arg));
    }
    return node;
  }

  // Bounds recursion on pathological nesting so it fails cleanly instead of overflowing the stack.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting)
        p_.fail("template nesting too deep (more than " + std::to_string(kMaxNesting) + " levels)");
    }
    ~DepthGuard() { --p_.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;

   private:
    Parser& p_;
  };
  static constexpr int kMaxNesting = 200;

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int depth_ = 0;
  int soft_ = 0;        // > 0 inside `if` statements (unknown filters fail at run time there)
  int loop_depth_ = 0;  // for break/continue
  std::vector<Macro*> macros_;
  std::vector<Unknown> unknown_;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_template(); }

}  // namespace swarm::jinja
