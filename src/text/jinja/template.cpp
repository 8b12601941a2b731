#include "text/jinja/template.hpp"

#include "common/error.hpp"
#include "text/jinja/lexer.hpp"
#include "text/jinja/parser.hpp"
#include "text/jinja/unicode.hpp"

namespace swarm::jinja {

struct Template::Impl {
  std::string source;  // normalised
  TemplateOptions options;
  Body body;
};

namespace {

std::shared_ptr<Scope> global_scope() {
  static const std::shared_ptr<Scope> globals = [] {
    auto s = std::make_shared<Scope>();
    s->vars = global_functions();
    return s;
  }();
  return globals;
}

[[noreturn]] void rethrow(const Error& e, const std::string& source, const std::string& prefix) {
  std::string where;
  if (e.offset != Error::kNoOffset) {
    const size_t off = std::min(e.offset, source.size());
    size_t line = 1, line_start = 0;
    for (size_t i = 0; i < off; ++i) {
      if (source[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    const size_t column = unicode::length(std::string_view(source).substr(line_start, off - line_start)) + 1;
    where = " at line " + std::to_string(line) + ", column " + std::to_string(column);
  }
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, prefix + " error" + where + ": " + e.what());
}

}  // namespace

Template::Template(const std::string& source, TemplateOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->source = normalize_source(source, options.keep_trailing_newline);
  impl->options = std::move(options);
  try {
    LexerOptions lex;
    lex.trim_blocks = impl->options.trim_blocks;
    lex.lstrip_blocks = impl->options.lstrip_blocks;
    impl->body = parse(tokenize(impl->source, lex));
  } catch (const Error& e) {
    rethrow(e, impl->source, impl->options.error_prefix);
  }
  impl_ = std::move(impl);
}

std::string Template::render(const Variables& variables, const WallClock& clock, size_t size_hint) const {
  auto root = std::make_shared<Scope>(global_scope());
  root->vars = variables;
  Runtime rt(root, clock);
  std::string out;
  out.reserve(size_hint);
  try {
    rt.exec_body(impl_->body, out);
  } catch (const Error& e) {
    rethrow(e, impl_->source, impl_->options.error_prefix);
  }
  return out;
}

}  // namespace swarm::jinja
