// Jinja abstract syntax tree. Nodes are immutable after parsing; evaluation lives in
// interpreter.cpp (each node evaluates itself against a per-render Runtime), so a parsed
// template can be rendered concurrently from many threads.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/builtins.hpp"
#include "text/jinja/value.hpp"

namespace swarm::jinja {

class Runtime;

struct Node {
  virtual ~Node() = default;
  size_t offset = 0;  // byte offset in the (normalised) source, for error messages
};

struct Expr : Node {
  /// Evaluates; errors raised without a position get this node's.
  Value eval(Runtime& rt) const;

 protected:
  virtual Value do_eval(Runtime& rt) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct KeywordArg {
  std::string name;
  ExprPtr value;
};

// ---------------------------------------------------------------- expressions

struct Literal : Expr {
  Value value;
  Value do_eval(Runtime& rt) const override;
};

struct Name : Expr {
  std::string name;
  Value do_eval(Runtime& rt) const override;
};

/// [a, b] or (a, b)
struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  bool tuple = false;
  Value do_eval(Runtime& rt) const override;
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value do_eval(Runtime& rt) const override;
};

/// obj.name
struct GetAttr : Expr {
  ExprPtr object;
  std::string name;
  Value do_eval(Runtime& rt) const override;
};

/// obj[key]
struct GetItem : Expr {
  ExprPtr object;
  ExprPtr key;
  Value do_eval(Runtime& rt) const override;
};

/// obj[start:stop:step]; any part may be null.
struct SliceExpr : Expr {
  ExprPtr object, start, stop, step;
  Value do_eval(Runtime& rt) const override;
};

struct Call : Expr {
  ExprPtr callee;
  std::vector<ExprPtr> args;
  std::vector<KeywordArg> kwargs;
  /// Evaluates the arguments.
  CallArgs eval_args(Runtime& rt) const;
  Value do_eval(Runtime& rt) const override;
};

/// value | name(args). `input` is null in filter chains of {% filter %} and block {% set %}.
struct FilterExpr : Expr {
  ExprPtr input;
  std::string name;
  FilterFn fn = nullptr;  // null: unknown filter in a conditional branch (error when reached)
  std::vector<ExprPtr> args;
  std::vector<KeywordArg> kwargs;
  /// Applies this filter to an already evaluated input.
  Value apply(Runtime& rt, const Value& input_value) const;
  Value do_eval(Runtime& rt) const override;
};

/// value is [not] name(args)
struct TestExpr : Expr {
  ExprPtr input;
  std::string name;
  TestFn fn = nullptr;  // null: unknown test in a conditional branch (error when reached)
  std::vector<ExprPtr> args;
  std::vector<KeywordArg> kwargs;
  bool negated = false;
  Value do_eval(Runtime& rt) const override;
};

enum class UnaryOp { NEG, POS, NOT };
struct Unary : Expr {
  UnaryOp op;
  ExprPtr operand;
  Value do_eval(Runtime& rt) const override;
};

enum class BinaryOp { ADD, SUB, MUL, DIV, FLOORDIV, MOD, POW, CONCAT };
struct Binary : Expr {
  BinaryOp op;
  ExprPtr left, right;
  Value do_eval(Runtime& rt) const override;
};

/// `and` / `or` (short-circuit, returning an operand as Python does).
struct Logical : Expr {
  bool is_and = true;
  ExprPtr left, right;
  Value do_eval(Runtime& rt) const override;
};

enum class CompareOp { EQ, NE, LT, LE, GT, GE, IN, NOT_IN };
/// a < b <= c ... (chained as in Python)
struct Compare : Expr {
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
  Value do_eval(Runtime& rt) const override;
};

/// a if cond else b (b may be null: undefined)
struct CondExpr : Expr {
  ExprPtr test, then, otherwise;
  Value do_eval(Runtime& rt) const override;
};

// ---------------------------------------------------------------- statements

enum class Flow { NORMAL, BREAK, CONTINUE };

struct Stmt : Node {
  /// Executes, appending output; errors raised without a position get this node's.
  Flow exec(Runtime& rt, std::string& out) const;

 protected:
  virtual Flow do_exec(Runtime& rt, std::string& out) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

/// Assignment target: a name, a tuple of targets, or namespace attribute (`ns.attr`).
struct Target {
  enum class Kind { NAME, TUPLE, ATTR } kind = Kind::NAME;
  std::string name;           // NAME, or the namespace variable for ATTR
  std::string attr;           // ATTR
  std::vector<Target> items;  // TUPLE
  size_t offset = 0;
};

struct Text : Stmt {
  std::string text;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

struct Print : Stmt {
  ExprPtr expr;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

struct If : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body else_body;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

struct For : Stmt {
  Target target;
  ExprPtr iter;
  ExprPtr filter;  // `for x in xs if cond`; may be null
  Body body;
  Body else_body;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

struct Assign : Stmt {
  Target target;
  ExprPtr value;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

/// {% set x %}...{% endset %}, optionally with `| filters`.
struct AssignBlock : Stmt {
  Target target;
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

struct Param {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Macro : Stmt {
  std::string name;
  std::vector<Param> params;
  Body body;
  bool uses_varargs = false, uses_kwargs = false, uses_caller = false;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

/// {% call(params) macro(args) %}body{% endcall %}
struct CallBlock : Stmt {
  std::unique_ptr<Call> call;
  std::vector<Param> caller_params;
  Body body;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

/// {% filter f | g %}body{% endfilter %}
struct FilterBlock : Stmt {
  std::vector<std::unique_ptr<FilterExpr>> filters;
  Body body;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

struct With : Stmt {
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

/// {% break %} / {% continue %}
struct LoopControl : Stmt {
  bool is_break = true;
  Flow do_exec(Runtime& rt, std::string& out) const override;
};

}  // namespace swarm::jinja
