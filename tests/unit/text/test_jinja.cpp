// Unit tests of the Jinja interpreter (src/text/jinja): syntax, semantics, filters,
// tests, whitespace control and errors, plus a parity sweep of small templates against
// Python's jinja2 (tests/reference/render_chat_template.py, run with /usr/bin/python3).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/error.hpp"
#include "text/jinja/template.hpp"
#include "text/jinja/value.hpp"

namespace swarm::jinja {
namespace {

using ojson = nlohmann::ordered_json;

// 2024-07-26 12:00:00 UTC, the instant the Python reference uses for strftime_now.
constexpr int64_t kNow = 1721995200;

std::chrono::system_clock::time_point fixed_now() {
  return std::chrono::system_clock::time_point(std::chrono::seconds(kNow));
}

Variables to_vars(const ojson& vars) {
  Variables out;
  for (auto it = vars.begin(); it != vars.end(); ++it) out.emplace_back(it.key(), from_json(it.value()));
  return out;
}

std::string render(const std::string& src, const ojson& vars = ojson::object()) {
  return Template(src).render(to_vars(vars), fixed_now);
}

// The error message of rendering (or parsing) `src`; fails the test if it succeeds.
std::string error_of(const std::string& src, const ojson& vars = ojson::object()) {
  try {
    std::string out = render(src, vars);
    ADD_FAILURE() << "expected an error from: " << src << "\n  rendered: " << out;
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

// ------------------------------------------------------------------ expressions

TEST(JinjaExpressions, Literals) {
  EXPECT_EQ(
      render(
          "{{ 'a\\'b' }}|{{ \"q\\\"\" }}|{{ '\\t\\n\\\\' }}|{{ '\\x41\\u00e9\\U0001F600' }}|{{ 'a\\qb' }}"),
      "a'b|q\"|\t\n\\|Aé😀|a\\qb");
  EXPECT_EQ(render("{{ 'a' 'b' }}{{ 42 }}{{ 1_000 }}{{ 0x1f }}{{ 1.5 }}{{ 1e3 }}"),
            "ab42100031" + std::string("1.51000.0"));
  EXPECT_EQ(render("{{ none }}{{ None }}{{ true }}{{ True }}{{ false }}{{ False }}"),
            "NoneNoneTrueTrueFalseFalse");
  EXPECT_EQ(render("{{ [1, 'a', 1.0, none, true] }}"), "[1, 'a', 1.0, None, True]");
  EXPECT_EQ(render("{{ {'k': (1, 2), 'e': ()} }}{{ (1,) }}{{ {} }}{{ [] }}"),
            "{'k': (1, 2), 'e': ()}(1,){}[]");
  EXPECT_EQ(render("{{ [\"a'b\", 'a\"b', \"a'\\\"b\", '\\n', 'é'] }}"),
            "[\"a'b\", 'a\"b', 'a\\'\"b', '\\n', 'é']");
}

TEST(JinjaExpressions, FloatsPrintLikePython) {
  EXPECT_EQ(
      render("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 + 0.3 }} {{ 1.5e-5 }} {{ 0.0001 }} {{ 1e100 }} {{ -0.0 }}"),
      "0.30000000000000004 1e+16 1000000000000000.2 1.5e-05 0.0001 1e+100 -0.0");
  EXPECT_EQ(
      render("{{ 1.0 }} {{ 3.0e5 }} {{ 12345678901234567.0 }} {{ 5e-324 }} {{ 1.7976931348623157e308 }}"),
      "1.0 300000.0 1.2345678901234568e+16 5e-324 1.7976931348623157e+308");
  EXPECT_EQ(render("{{ 1e400 }} {{ -1e400 }} {{ 0.0 * 1e400 }}"), "inf -inf nan");
}

TEST(JinjaExpressions, Arithmetic) {
  EXPECT_EQ(render("{{ 7/2 }} {{ 7//2 }} {{ -7//2 }} {{ -7 % 3 }} {{ 2**10 }} {{ 2**-1 }} {{ 2.0**2 }}"),
            "3.5 3 -4 2 1024 0.5 4.0");
  EXPECT_EQ(render("{{ -3 // 2 }} {{ 3 % -2 }} {{ -3.5 // 2 }} {{ -3.5 % 2 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }} "
                   "{{ 10 / 4 }}"),
            "-2 -1 -2.0 0.5 3.0 1.5 2.5");
  // Jinja's precedence quirks: unary minus binds tighter than **, and ** is left-associative.
  EXPECT_EQ(render("{{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ - -1 }}"),
            "4 64 7 9 1");
  EXPECT_EQ(render("{{ 'x' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ true + 1 }}"),
            "xxx [1, 1] [1, 2] ab 2");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ 1.0 ~ [1] }}"), "a1None1.0[1]");
  EXPECT_EQ(
      render(
          "{{ '%s-%d' % ('a', 3) }} {{ '%.2f' % 3.14159 }} {{ '%5d|%-5s|' % (42, 'ab') }} {{ '%x' % 255 }}"),
      "a-3 3.14    42|ab   | ff");
}

TEST(JinjaExpressions, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ 1 == 1.0 }}{{ 'a' < 'b' }}{{ [1, 2] == [1, 2] }}{{ none == none }}{{ 1 in [1.0] }}"),
            "TrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 != 2 }}{{ 'a' not in 'b' }}{{ [1, 2] < [1, 3] }}"),
            "TrueFalseTrueTrueTrue");
  EXPECT_EQ(render("{{ 'a' == 1 }}{{ none == 0 }}{{ true == 1 }}{{ (1, 2) == [1, 2] }}"),
            "FalseFalseTrueFalse");
  EXPECT_EQ(
      render(
          "{{ true and 'yes' or 'no' }}|{{ false and 'yes' or 'no' }}|{{ none or 0 or '' }}|{{ 0 and 1 }}"),
      "yes|no||0");
  EXPECT_EQ(render("{{ not 1 }}{{ not none }}{{ 'ell' in 'hello' }}{{ 1 in {1: 2} }}{{ 'k' in {'k': 1} }}"),
            "FalseTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 'a' if 1 else 'b' }}{{ 'a' if 0 else 'b' }}[{{ 'a' if 0 }}]"), "ab[]");
}

TEST(JinjaExpressions, AttributeAndSubscript) {
  const ojson vars = {{"d", {{"a", 1}, {"b", {1, 2}}, {"n", {{"x", {{"y", "deep"}}}}}}}};
  EXPECT_EQ(render("{{ d.b }}{{ d['b'][0] }}{{ d.n.x.y }}{{ d['n']['x']['y'] }}{{ d.b.1 }}", vars),
            "[1, 2]1deepdeep2");
  EXPECT_EQ(render("[{{ d.missing }}][{{ d['missing'] }}][{{ d.b[5] }}][{{ d.a.b }}][{{ none.x }}]", vars),
            "[][][][][]");
  EXPECT_EQ(render("{{ d.missing is defined }}{{ d.a is defined }}{{ d.items is defined }}", vars),
            "FalseTrueTrue");
  EXPECT_EQ(render("{{ d.get('a') }}{{ d.get('zz', 'z') }}{{ d.get('zz') }}", vars), "1zNone");
}

TEST(JinjaExpressions, Slicing) {
  EXPECT_EQ(render("{{ 'abc'[1:] }}|{{ 'abc'[:-1] }}|{{ [1, 2, 3, 4][::2] }}|{{ [1, 2, 3, 4][-2:] }}|{{ [1, "
                   "2][5:] }}"),
            "bc|ab|[1, 3]|[3, 4]|[]");
  EXPECT_EQ(render("{{ 'abc'[::-1] }}|{{ 'abcdef'[4:1:-1] }}|{{ [1, 2, 3][::-2] }}|{{ 'abc'[-1] }}|{{ (1, 2, "
                   "3)[1:] }}"),
            "cba|edc|[3, 1]|c|(2, 3)");
  // Strings index and slice by code point, not byte.
  EXPECT_EQ(render("{{ 'héllo'[1] }}|{{ 'héllo'[::-1] }}|{{ 'héllo'[1:3] }}|{{ 'héllo'|length }}"),
            "é|olléh|él|5");
  EXPECT_EQ(render("{% set xs = [1, 2, 3] %}{% for x in xs[::-1] %}{{ x }}{% endfor %}"), "321");
}

TEST(JinjaExpressions, UndefinedSemantics) {
  EXPECT_EQ(render("[{{ nothing }}]{{ nothing is defined }}{{ nothing is undefined }}{{ nothing|length }}"),
            "[]FalseTrue0");
  EXPECT_EQ(render("{{ 'x' ~ nothing ~ 'y' }}{% for x in nothing %}{{ x }}{% else %}empty{% endfor %}"),
            "xyempty");
  EXPECT_EQ(render("{{ nothing == nothing }}{{ nothing is none }}{% if nothing %}t{% else %}f{% endif %}"),
            "TrueFalsef");
  EXPECT_EQ(render("{{ nothing|default('d') }}{{ none|default('d') }}{{ none|default('d', true) }}{{ "
                   "''|d('e', true) }}"),
            "dNonede");
  EXPECT_NE(error_of("{{ nothing.attr }}").find("'nothing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ nothing + 1 }}").find("'nothing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ nothing() }}").find("'nothing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ d.content.startswith('x') }}", {{"d", ojson::object()}})
                .find("'dict object' has no attribute 'content'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ m[0].role }}", {{"m", ojson::array()}}).find("list object has no element 0"),
            std::string::npos);
}

// ------------------------------------------------------------------ statements

TEST(JinjaStatements, IfElifElse) {
  const std::string t = "{% if x > 3 and x < 10 %}mid{% elif x >= 10 %}big{% else %}small{% endif %}";
  EXPECT_EQ(render(t, {{"x", 5}}), "mid");
  EXPECT_EQ(render(t, {{"x", 50}}), "big");
  EXPECT_EQ(render(t, {{"x", 1}}), "small");
}

TEST(JinjaStatements, ForLoopVariables) {
  EXPECT_EQ(
      render(
          "{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
          "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"),
      "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}"),
            "/2;1/3;2/;");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{{ loop.depth }}{% endfor %}"),
            "a1b1a1");
  EXPECT_EQ(render("{% for a in [1, 2] %}{% for b in [1, 2] %}{{ loop.index }}{% endfor %}{{ loop.index "
                   "}}|{% endfor %}"),
            "121|122|");
}

TEST(JinjaStatements, ForVariants) {
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}),
            "b=1;a=2;");
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}), "ba");
  EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}"), "1234");
  EXPECT_EQ(render("{% for c in 'hé' %}[{{ c }}]{% endfor %}"), "[h][é]");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(
      render(
          "{% for x in [1, 2, 3] if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ loop.last }};{% endfor %}"),
      "1/2False;2/2True;");
  EXPECT_EQ(
      render("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}"
             "{% endif %}{{ i }}{% endfor %}"),
      "0134");
  EXPECT_NE(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}").find("too many values to unpack"),
            std::string::npos);
  EXPECT_NE(error_of("{% for x in 5 %}{% endfor %}").find("'int' object is not iterable"), std::string::npos);
}

TEST(JinjaStatements, SetAndScoping) {
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  // A set inside a loop is local to the iteration; inside an if it is not.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{% endfor %}{{ x }}"),
            "1111");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}"),
            "2221");
  EXPECT_EQ(render("{% if true %}{% set y = 5 %}{% endif %}{{ y }}"), "5");
  EXPECT_EQ(render("{% set x %}block {{ 1 }}{% endset %}{{ x }}|{{ x|length }}"), "block 1|7");
  EXPECT_EQ(render("{% set x | upper %}abc{% endset %}{{ x }}"), "ABC");
  EXPECT_EQ(render("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"), "3[]");
}

TEST(JinjaStatements, Namespace) {
  EXPECT_EQ(
      render(
          "{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}"
          "{{ ns.a }}{{ ns.b }}{{ ns }}"),
      "4x<Namespace {'a': 4, 'b': 'x'}>");
  EXPECT_EQ(
      render("{% set ns = namespace() %}{% set ns.found = true %}{{ ns.found }}{{ ns.missing is defined }}"),
      "TrueFalse");
  EXPECT_NE(
      error_of("{% set d = {} %}{% set d.x = 1 %}").find("cannot assign attribute on non-namespace object"),
      std::string::npos);
  // A namespace may hold another, never itself (found by fuzz_jinja: printing it recursed until
  // the stack ran out, and the cycle was never freed).
  EXPECT_EQ(render("{% set a = namespace(v=1) %}{% set b = namespace(inner=a) %}{{ b.inner.v }}{{ b }}"),
            "1<Namespace {'inner': <Namespace {'v': 1}>}>");
  EXPECT_NE(error_of("{% set ns = namespace(x=0) %}{% set ns.x = ns %}{{ ns.x }}").find("cannot hold itself"),
            std::string::npos);
  EXPECT_NE(error_of("{% set a = namespace() %}{% set b = namespace(l=[a]) %}{% set a.b = {'k': b} %}")
                .find("cannot hold itself"),
            std::string::npos);
}

TEST(JinjaStatements, Macros) {
  EXPECT_EQ(render("{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}"
                   "{{ greet('Bob') }}{{ greet('Al', greeting='Hi') }}{{ greet(name='X') }}"),
            "Hello, Bob!Hi, Al!Hello, X!");
  EXPECT_EQ(render("{% macro m(a, b=a) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}{{ "
                   "m(1, 2, 3, z=4) }}"),
            "11(){}12(3,){'z': 4}");
  // Macros see the template's top-level variables at call time.
  EXPECT_EQ(render("{% macro m() %}{{ x }}{% endmacro %}{% set x = 1 %}{{ m() }}{% set x = 2 %}{{ m() }}"),
            "12");
  EXPECT_EQ(render("{% macro w(a) %}[{{ caller() }}{{ a }}]{% endmacro %}{% call w(1) %}inner{% endcall %}"),
            "[inner1]");
  EXPECT_EQ(render("{% macro w() %}{{ caller(2) }}{% endmacro %}{% call(n) w() %}n={{ n }}{% endcall %}"),
            "n=2");
  EXPECT_NE(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").find("takes not more than 1 argument"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}").find("no keyword argument 'b'"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}").find("recursion"), std::string::npos);
}

TEST(JinjaStatements, RawCommentsFilterBlockGeneration) {
  EXPECT_EQ(render("{% raw %}{{ not }}{% endraw %}"), "{{ not }}");
  EXPECT_EQ(render("a{# comment {{ x }} #}b"), "ab");
  EXPECT_EQ(render("{% filter upper %}abc{{ 'd' }}{% endfilter %}"), "ABCD");
  EXPECT_EQ(render("{% generation %}kept{% endgeneration %}"), "kept");
}

// ------------------------------------------------------------------ whitespace

TEST(JinjaWhitespace, TrimAndLstripBlocks) {
  EXPECT_EQ(render("line1\n  {% if true %}\n  x\n  {% endif %}\n  {# c #}\nend\n"), "line1\n  x\nend");
  EXPECT_EQ(render("{% for m in [1, 2] %}\n  {{ m }}\n{% endfor %}"), "  1\n  2\n");
  EXPECT_EQ(render("{{ 'x' }}   {# c #}  \ny"), "x     \ny");  // not at line start: no lstrip
  EXPECT_EQ(render("a  {% if true %}x{% endif %}"), "a  x");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}\n"), "a\nb");  // one trailing newline dropped, none after }}
}

TEST(JinjaWhitespace, Markers) {
  EXPECT_EQ(render("{%- if true -%}\n   a\n{%- endif -%}\n   b"), "ab");
  EXPECT_EQ(render("a\n    {{- 'b' -}}\n    c"), "abc");
  EXPECT_EQ(render("a\n   {%+ if true %}b{% endif %}\nc"), "a\n   bc");
  EXPECT_EQ(render("a {%+ if true %}b{% endif +%}\nc"), "a b\nc");
  EXPECT_EQ(render("{% raw -%}\n  {{ x }}\n  {%- endraw %}\nz"), "{{ x }}z");
  EXPECT_EQ(render("x {# c2 -#}   y"), "x y");
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");
}

// ------------------------------------------------------------------ filters

TEST(JinjaFilters, Strings) {
  EXPECT_EQ(render("{{ 'Hello World'|lower }}|{{ 'abc'|upper }}|{{ 'hELLO wORLD'|capitalize }}|{{ "
                   "'hello-world foo'|title }}"),
            "hello world|ABC|Hello world|Hello-World Foo");
  EXPECT_EQ(render("{{ \"it's o'neil x_y\"|title }}|{{ 'héllo wörld'|upper }}"),
            "It's O'neil X_y|HÉLLO WÖRLD");
  EXPECT_EQ(render("[{{ '  x  '|trim }}][{{ 'xxaxx'|trim('x') }}][{{ 'a b'|replace(' ', '_') }}][{{ "
                   "'aaa'|replace('a', "
                   "'b', 2) }}]"),
            "[x][a][a_b][bba]");
  EXPECT_EQ(
      render("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\nb'|indent(first=true) }}"),
      "a\n  b\n\n  c|  a\n  b|    a\n    b");
  EXPECT_EQ(render("{{ '<a href=\"x\">&'|e }}|{{ '<b>'|escape }}|{{ '<c>'|safe }}"),
            "&lt;a href=&#34;x&#34;&gt;&amp;|&lt;b&gt;|<c>");
  EXPECT_EQ(render("{{ '%s and %s'|format('a', 'b') }}|{{ '%(x)s'|format(x=1) }}|{{ 'ab'|center(6) }}|"),
            "a and b|1|  ab  |");
  EXPECT_EQ(render("{{ 'hello world'|truncate(8, true, '..', 0) }}|{{ 'Hello big world'|wordcount }}|{{ "
                   "'abc'|reverse }}"),
            "hello ..|3|cba");
}

TEST(JinjaFilters, Conversions) {
  EXPECT_EQ(
      render("{{ '3'|int }}{{ '3.5'|int }}{{ 3.7|int }}{{ 'x'|int }}{{ 'x'|int(7) }}{{ '0x1A'|int(0, 16) }}"),
      "3330726");
  EXPECT_EQ(render("{{ '3.5'|float }} {{ 3|float }} {{ 'x'|float }} {{ 3|string }} {{ [1]|string }} {{ "
                   "none|string }}"),
            "3.5 3.0 0.0 3 [1] None");
  EXPECT_EQ(
      render("{{ 'ab'|list }}{{ d|list }}{{ d|items|list }}{{ (1, 2)|list }}", {{"d", {{"a", 1}, {"b", 2}}}}),
      "['a', 'b']['a', 'b'][('a', 1), ('b', 2)][1, 2]");
  EXPECT_EQ(
      render(
          "{{ -3|abs }} {{ 1.234|round(1) }} {{ 2.5|round }} {{ 0.5|round }} {{ 2.5|round(0, 'floor') }} {{ "
          "2.1|round(0, 'ceil') }}"),
      "3 1.2 2.0 0.0 2.0 3.0");
}

TEST(JinjaFilters, Sequences) {
  EXPECT_EQ(
      render(
          "{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'a']|sort }}{{ ['b', 'A', 'a']|sort(case_sensitive=true) }}{{ "
          "[3, 1]|sort(reverse=true) }}"),
      "[1, 2, 3]['A', 'a', 'b']['A', 'a', 'b'][3, 1]");
  EXPECT_EQ(
      render("{{ [3, 1, 2]|first }}{{ [3, 1, 2]|last }}{{ 'abc'|first }}[{{ []|first }}]{{ [1, 2]|join(', ') "
             "}}{{ ['x', none, 1]|join('-') }}"),
      "32a[]1, 2x-None-1");
  EXPECT_EQ(
      render(
          "{{ [1, 2, 3]|length }}{{ 'héllo'|count }}{{ {'a': 1}|length }}{{ [3, 1]|max }}{{ [3, 1]|min }}{{ "
          "[1, 2]|sum }}"),
      "351313");
  EXPECT_EQ(
      render("{{ [1, 2, 2]|unique|list }}{{ [1, 2, 3]|reverse|list }}{{ [1, 2, 3]|batch(2)|list }}{{ [1, 2, "
             "3]|slice(2)|list }}"),
      "[1, 2][3, 2, 1][[1, 2], [3]][[1, 2], [3]]");
  EXPECT_EQ(render("{% for k, v in {'b': 1, 'a': 2}|dictsort %}{{ k }}{{ v }}{% endfor %}"), "a2b1");
}

TEST(JinjaFilters, SelectMapAttr) {
  const ojson vars = {{"l", {{{"n", "a"}, {"v", 1}}, {{"n", "b"}, {"v", 2}}, {{"x", 3}}}}};
  EXPECT_EQ(render("{{ l|selectattr('n')|map(attribute='n')|list }}", vars), "['a', 'b']");
  EXPECT_EQ(render("{{ l[:2]|selectattr('v', 'gt', 1)|map(attribute='n')|list }}", vars), "['b']");
  // Like Jinja, comparing a missing attribute (undefined) fails.
  EXPECT_NE(error_of("{{ l|selectattr('v', 'gt', 1)|list }}", vars).find("has no attribute 'v'"),
            std::string::npos);
  EXPECT_EQ(render("{{ l|rejectattr('n', 'defined')|list }}", vars), "[{'x': 3}]");
  EXPECT_EQ(render("{{ l|map(attribute='n', default='?')|join }}", vars), "ab?");
  EXPECT_EQ(render("{{ [1, 2, 3]|select('odd')|list }}{{ [1, 2, 3]|reject('odd')|list }}{{ ['a', "
                   "'b']|select('equalto', 'a')|list }}"),
            "[1, 3][2]['a']");
  EXPECT_EQ(render("{{ ['a', 'b']|map('upper')|join }}{{ [1, '2']|map('string')|list }}"), "AB['1', '2']");
  EXPECT_EQ(render("{{ l|sum(attribute='v', start=10) }}", {{"l", {{{"v", 1}}, {{"v", 2}}}}}), "13");
}

TEST(JinjaFilters, ToJsonMatchesPythonJsonDumps) {
  const ojson vars = {{"d", {{"b", 1}, {"a", {1, 2}}}}};
  EXPECT_EQ(render("{{ d|tojson }}", vars), "{\"b\": 1, \"a\": [1, 2]}");  // insertion order kept
  EXPECT_EQ(render("{{ d|tojson(indent=2) }}", vars), "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2\n  ]\n}");
  EXPECT_EQ(render("{{ d|tojson(sort_keys=true) }}", vars), "{\"a\": [1, 2], \"b\": 1}");
  EXPECT_EQ(render("{{ d|tojson(separators=(',', ':')) }}", vars), "{\"b\":1,\"a\":[1,2]}");
  EXPECT_EQ(render("{{ {'x': 1.0, 'y': 1e100, 'z': 'é\"\\n', 'w': none, 'v': [true]}|tojson }}"),
            "{\"x\": 1.0, \"y\": 1e+100, \"z\": \"é\\\"\\n\", \"w\": null, \"v\": [true]}");
  EXPECT_EQ(render("{{ 'emoji 😀 \\u0001 \\x7f \\u2028'|tojson }}"), "\"emoji 😀 \\u0001 \x7f \u2028\"");
  EXPECT_EQ(render("{{ 'é😀'|tojson(ensure_ascii=true) }}"), "\"\\u00e9\\ud83d\\ude00\"");
  EXPECT_EQ(render("{{ [] | tojson(indent=2) }}{{ {} | tojson(indent=2) }}{{ [[]]|tojson(indent=2) }}"),
            "[]{}[\n  []\n]");
  EXPECT_EQ(render("{{ {'a': [1, {'b': 2}]} | tojson(indent='\\t') }}"),
            "{\n\t\"a\": [\n\t\t1,\n\t\t{\n\t\t\t\"b\": 2\n\t\t}\n\t]\n}");
  EXPECT_EQ(render("{{ {1: 'a', true: 'b', none: 'c', 1.5: 'd'}|tojson }}"),
            "{\"1\": \"b\", \"null\": \"c\", \"1.5\": \"d\"}");
  EXPECT_EQ(render("{{ 0.0|tojson }}{{ -0.0|tojson }}{{ 1e22|tojson }}{{ 1e-7|tojson }}{{ 100.0|tojson }}"),
            "0.0-0.01e+221e-07100.0");
  EXPECT_NE(error_of("{{ nothing|tojson }}").find("not JSON serializable"), std::string::npos);
}

// ------------------------------------------------------------------ tests

TEST(JinjaTests, BuiltinTests) {
  const ojson vars = {{"d", {{"a", 1}}}};
  EXPECT_EQ(
      render(
          "{{ 1 is number }}{{ 1.0 is integer }}{{ 1 is integer }}{{ true is boolean }}{{ true is number }}"
          "{{ 1.5 is float }}",
          vars),
      "TrueFalseTrueTrueTrueTrue");
  EXPECT_EQ(
      render(
          "{{ 'a' is iterable }}{{ d is mapping }}{{ d is iterable }}{{ 'a' is sequence }}{{ d is sequence }}"
          "{{ 1 is iterable }}{{ [] is sequence }}",
          vars),
      "TrueTrueTrueTrueTrueFalseTrue");
  EXPECT_EQ(render("{{ none is none }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}"),
            "TrueTrueFalseTrueFalse");
  EXPECT_EQ(
      render("{{ 1 is equalto 1 }}{{ 1 is eq 1 }}{{ 2 is in [1, 2] }}{{ 'x' is string }}{{ 1 is string }}"
             "{{ 1 is odd }}{{ 2 is even }}{{ 6 is divisibleby 3 }}{{ 3 is gt 2 }}{{ 3 is ne 3 }}"),
      "TrueTrueTrueTrueFalseTrueTrueTrueTrueFalse");
  EXPECT_EQ(render("{{ 'x' is lower }}{{ 'X' is upper }}{{ 1 is callable }}{{ range is callable }}{{ none is "
                   "sameas none }}"
                   "{{ x is not defined }}{{ 'upper' is filter }}{{ 'nope' is test }}"),
            "TrueTrueFalseTrueTrueTrueTrueFalse");
}

// ------------------------------------------------------------------ methods and globals

TEST(JinjaMethods, StringMethods) {
  EXPECT_EQ(render("{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('c', 'x')) }}{{ 'abcb'.find('b') }}{{ "
                   "'abcb'.rfind('b') }}"
                   "{{ 'abcb'.count('b') }}{{ 'abcb'.replace('b', 'X') }}{{ 'abcb'.replace('b', 'X', 1) }}"),
            "TrueTrue132aXcXaXcb");
  EXPECT_EQ(
      render("{{ 'héllo'.find('l') }}{{ 'hELLO'.capitalize() }}{{ 'AbC'.swapcase() }}{{ \"it's\".title() }}"
             "{{ 'hi'.upper() }}{{ 'HI'.lower() }}"),
      "2HelloaBcIt'SHIhi");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }}{{ '  a  b '.split() }}{{ 'a b c'.split(' ', 1) }}{{ "
                   "'a.b.c'.rsplit('.', 1) }}"
                   "{{ 'a\\nb'.splitlines() }}"),
            "['a', 'b', '', 'c']['a', 'b']['a', 'b c']['a.b', 'c']['a', 'b']");
  EXPECT_EQ(render("[{{ ' a '.strip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\na\\n'.lstrip('\\n') }}][{{ "
                   "'a\\n\\n'.rstrip() }}]"),
            "[a][a][a\n][a]");
  EXPECT_EQ(
      render("{{ '-'.join(['a', 'b']) }}{{ '{} {}'.format(1, 'a') }}{{ '{0}{name}'.format(1, name='n') }}"
             "{{ '{:>5}'.format('x') }}{{ '{:.2f}'.format(3.14159) }}"),
      "a-b1 a1n    x3.14");
  EXPECT_EQ(
      render(
          "{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ ' '.isspace() }}{{ 'x'.zfill(3) }}[{{ 'ab'.ljust(4) }}]"
          "{{ 'ab'.center(5, '*') }}{{ 'a  b'.partition(' ') }}{{ 'abc'.removeprefix('a') }}"),
      "TrueTrueTrue00x[ab  ]**ab*('a', ' ', ' b')bc");
  EXPECT_NE(error_of("{{ 'abc'.nosuch() }}").find("'str object' has no attribute 'nosuch'"),
            std::string::npos);
}

TEST(JinjaMethods, DictAndListMethods) {
  const ojson vars = {{"d", {{"a", 1}, {"b", {1, 2}}}}};
  EXPECT_EQ(render("{{ d.items()|list }}{{ d.keys()|list }}{{ d.values()|list }}{{ d.get('a', 5) }}", vars),
            "[('a', 1), ('b', [1, 2])]['a', 'b'][1, [1, 2]]1");
  EXPECT_EQ(render("{{ [1, 2, 2].count(2) }}{{ [1, 2].index(2) }}"), "21");
  // The immutable sandbox refuses mutation.
  EXPECT_NE(error_of("{{ [1, 2].append(3) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ d.update({}) }}", vars).find("unsafe"), std::string::npos);
}

TEST(JinjaGlobals, RangeDictNamespaceStrftime) {
  EXPECT_EQ(render("{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(5, 0, -2)|list }}"),
            "[0, 1, 2][1, 4, 7][5, 3, 1]");
  EXPECT_EQ(render("{{ dict(a=1, b='x') }}{{ dict(a=1).a }}{{ namespace(a=1).a }}"), "{'a': 1, 'b': 'x'}11");
  EXPECT_NE(error_of("{{ range(1000000)|length }}").find("Range too big"), std::string::npos);
  // strftime_now formats the injected clock in local time, like Python's datetime.now().
  const std::time_t t = kNow;
  std::tm local{};
  localtime_r(&t, &local);
  char expected[64];
  std::strftime(expected, sizeof(expected), "%d %b %Y %H:%M", &local);
  EXPECT_EQ(
      render("{{ strftime_now('%d %b %Y %H:%M') }}|{{ strftime_now('%Z%z') }}|{{ strftime_now('%f') }}"),
      std::string(expected) + "||000000");
}

TEST(JinjaGlobals, RaiseException) {
  const std::string msg = error_of("line one\n{{ raise_exception('Only user and assistant roles!') }}");
  EXPECT_EQ(msg, "template error at line 2, column 4: Only user and assistant roles!");
}

// ------------------------------------------------------------------ errors

TEST(JinjaErrors, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("ok\n  {{ 1 }"), "template error at line 2, column 8: unexpected '}'");
  EXPECT_EQ(error_of("{% if true %}"),
            "template error at line 1, column 14: unexpected end of template, expected "
            "'elif' or 'else' or 'endif'");
  EXPECT_EQ(error_of("a\nb\n{% foo %}"), "template error at line 3, column 4: unknown tag 'foo'");
  EXPECT_EQ(error_of("{% endfor %}"), "template error at line 1, column 4: unknown tag 'endfor'");
  EXPECT_EQ(error_of("{{ 'unterminated }}"),
            "template error at line 1, column 4: unterminated string literal");
  EXPECT_EQ(error_of("{# unterminated"), "template error at line 1, column 1: missing end of comment tag");
  EXPECT_EQ(error_of("{% break %}"), "template error at line 1, column 4: 'break' outside of a loop");
  EXPECT_EQ(error_of("{% for x in %}{% endfor %}"),
            "template error at line 1, column 13: expected an expression, got '%}'");
  EXPECT_EQ(error_of("{% include 'x' %}"), "template error at line 1, column 4: unsupported tag 'include'");
  EXPECT_EQ(error_of("{% set true = 1 %}"), "template error at line 1, column 8: can't assign to 'true'");
}

TEST(JinjaErrors, UnknownFiltersAndTests) {
  // Unknown filters and tests are errors at parse time...
  EXPECT_EQ(error_of("{{ 'x'|foo }}"), "template error at line 1, column 8: unknown filter 'foo'");
  EXPECT_EQ(error_of("\n\n    {{ x|upper|foo(1) }}"),
            "template error at line 3, column 16: unknown filter 'foo'");
  EXPECT_EQ(error_of("{{ x is nosuch }}"), "template error at line 1, column 6: unknown test 'nosuch'");
  EXPECT_EQ(error_of("{% for x in [1] %}{{ x|foo }}{% endfor %}"),
            "template error at line 1, column 24: unknown filter 'foo'");
  // ...except in branches Jinja compiles lazily (if bodies, conditional expressions): there
  // they fail only when evaluated.
  EXPECT_EQ(render("{% if false %}{{ x|foo }}{% endif %}ok"), "ok");
  EXPECT_EQ(render("{{ x|foo if false else 1 }}"), "1");
  EXPECT_EQ(error_of("{% if true %}{{ x|foo }}{% endif %}"),
            "template error at line 1, column 19: unknown filter 'foo'");
}

TEST(JinjaErrors, EdgeCasesFoundByDifferentialFuzzing) {
  EXPECT_EQ(render("{{ 0.1 is odd }}{{ 0.1 is even }}{{ 3.0 is odd }}{{ 4 is divisibleby 2.0 }}"),
            "FalseFalseTrueTrue");
  EXPECT_EQ(render("{{ nothing is callable }}{{ 'x %s' % [1] }}|{{ 'x' % [1] }}|{{ 'x %s' % nothing }}"),
            "Truex [1]|x|x ");
  EXPECT_NE(error_of("{{ n[1:] }}", {{"n", 5}}).find("'int' object is not subscriptable"), std::string::npos);
  EXPECT_NE(error_of("{{ d[1:] }}", {{"d", ojson::object()}}).find("unhashable type: 'slice'"),
            std::string::npos);
  EXPECT_NE(error_of("{{ [][0]|int }}").find("list object has no element 0"), std::string::npos);
  EXPECT_NE(error_of("{{ nothing|float }}").find("'nothing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 1.5|indent }}").find("unsupported operand type(s) for +=: 'float' and 'str'"),
            std::string::npos);
}

TEST(JinjaErrors, NestingLimits) {
  EXPECT_NE(
      error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}").find("nesting too deep"),
      std::string::npos);
  std::string deep_ifs;
  for (int i = 0; i < 300; ++i) deep_ifs += "{% if true %}";
  EXPECT_NE(error_of(deep_ifs).find("nesting too deep"), std::string::npos);
  ojson deep = 1;
  for (int i = 0; i < 600; ++i) deep = ojson::array({deep});
  EXPECT_THROW(from_json(deep), Error);
  EXPECT_EQ(render("{{ " + std::string(50, '(') + "1" + std::string(50, ')') + " }}"), "1");
}

TEST(JinjaErrors, RuntimeErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("{{ 1 }}\n{{ 'a' + 1 }}"),
            "template error at line 2, column 8: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"),
            "template error at line 1, column 6: integer division or modulo by zero");
  EXPECT_EQ(error_of("{{ 'a' < 1 }}"),
            "template error at line 1, column 4: '<' not supported between instances of 'str' and 'int'");
  EXPECT_EQ(error_of("{{ {}() }}"), "template error at line 1, column 4: 'dict' object is not callable");
  EXPECT_EQ(error_of("{{ 2 ** 70 }}"),
            "template error at line 1, column 6: integer overflow (values beyond 64 bits are not supported)");
  EXPECT_EQ(error_of("{{ none|length }}"),
            "template error at line 1, column 9: object of type 'NoneType' has no len()");
}

// ------------------------------------------------------------------ concurrency

TEST(JinjaTemplate, ConcurrentRendersShareOneParse) {
  const Template t(
      "{% set ns = namespace(n=0) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}");
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      std::vector<Value> xs;
      for (int k = 0; k <= i * 10; ++k) xs.push_back(Value::integer(k));
      for (int rep = 0; rep < 200; ++rep) results[i] = t.render({{"xs", Value::list(xs)}});
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) {
    const int n = i * 10;
    EXPECT_EQ(results[i], std::to_string(n * (n + 1) / 2));
  }
}

// ------------------------------------------------------------------ parity with Python's jinja2

// Runs the Python reference on a list of cases; returns its JSON list. Fails (not skips) when
// the reference cannot run: the parity check is an acceptance criterion.
ojson run_reference(const ojson& cases) {
  namespace fs = std::filesystem;
  const std::string script = std::string(SWARM_SOURCE_DIR) + "/tests/reference/render_chat_template.py";
  if (!fs::exists(script)) {
    ADD_FAILURE() << "missing Python reference runner " << script;
    return ojson();
  }
  if (!fs::exists("/usr/bin/python3")) {
    ADD_FAILURE() << "/usr/bin/python3 not found: install python3 and python3-jinja2 for the parity tests";
    return ojson();
  }
  const fs::path dir = fs::temp_directory_path();
  const std::string stamp = std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) +
                            "_" + std::to_string(::getpid());
  const fs::path in = dir / ("swarm_jinja_cases_" + stamp + ".json");
  const fs::path err = dir / ("swarm_jinja_stderr_" + stamp + ".txt");
  std::ofstream(in) << cases.dump();
  const std::string cmd =
      "/usr/bin/python3 '" + script + "' < '" + in.string() + "' 2> '" + err.string() + "'";
  std::string out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe) {
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
    const int status = ::pclose(pipe);
    if (status != 0) {
      std::ifstream e(err);
      std::stringstream ss;
      ss << e.rdbuf();
      ADD_FAILURE() << "reference runner failed (status " << status << "): " << ss.str()
                    << "\n(python3-jinja2 must be installed for /usr/bin/python3)";
      out.clear();
    }
  } else {
    ADD_FAILURE() << "popen failed for: " << cmd;
  }
  fs::remove(in);
  fs::remove(err);
  if (out.empty()) return ojson();
  return ojson::parse(out);
}

TEST(JinjaParity, SnippetsRenderLikePythonJinja2) {
  const std::vector<std::string> snippets = {
      "{{ [1, 'a', 1.0, none, true, {'k': (1, 2)}] }}",
      "{{ 1e20 }} {{ 1e16 }} {{ 1.5e-5 }} {{ 0.1 + 0.2 }} {{ 7 / 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** -1 "
      "}}",
      "{{ 10 / 3 }}{{ 1e15 + 0.3 }}{{ 0.1 + 0.7 }}{{ 1 / 3 }}{{ 123456789.123 }}{{ 1234567890123456.0 }}",
      "{{ s.upper() }}{{ s|upper }}{{ s.title() }}{{ s|title }}{{ s|capitalize }}{{ s.split() }}",
      "{{ \"a'b\" }}{{ [\"a'b\", 'a\"b', \"a'\\\"b\", \"\\n\\t\\\\\", \"é\", '\\u2028', '\\x00'] }}",
      "{% for x in [1, 2, 3] if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ loop.first }}{{ loop.last }}"
      "{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
      "{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ "
      "ns.a }}{{ ns "
      "}}",
      "{% macro m(a, b=a) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}{{ m(1, 2, 3, "
      "z=4) }}",
      "line1\n  {% if true %}\n  x\n  {% endif %}\n  {# c #}\nend\n",
      "  {% if true %}\n    x\n  {% endif %}\n  y",
      "{%- for m in [1, 2] -%}\n  {{ m }}\n{%- endfor -%}\n!",
      "a {%+ if true %}b{% endif +%}\nc",
      "{% raw %}\n  {{ x }}\n  {% endraw %}\nz",
      "a {# comment\nmulti #} b\n   {# indented comment #}\nc",
      "x{%- if true %}   y   {% endif -%}   z",
      "{% macro m(x) -%}\n  [{{ x }}]\n{%- endmacro %}\n{{ m(1) }} {{ m(2) }}",
      "{% for x in [1, 2] %}\n{% if x == 1 %}\none\n{% else %}\ntwo\n{% endif %}\n{% endfor %}",
      " {{ 'a' }} {% if true %} {% endif %} b",
      "{{ d|tojson }}{{ d|tojson(indent=2) }}{{ d|tojson(indent=4, sort_keys=true) }}",
      "{{ {'x': 1.0, 'y': 1e100, 'z': 'é\"\\n\\u0001', 'w': none, 'v': [true, -0.0, 1e-7]}|tojson }}",
      "{{ d.b }}{{ d['b'][0] }}{{ d.get('c', 'z') }}{{ d.c is defined }}{{ d.items is defined }}",
      "{{ [{'a': 2}, {'a': 1}]|sort(attribute='a') }}{{ ['b', 'A', 'a']|sort }}{{ [3, 1]|sort(reverse=true) "
      "}}",
      "{{ [1, 2, 2]|unique|list }}{{ 1.234|round(1) }}{{ 2.675|round(2) }}{{ -3|abs }}{{ 'ab'|center(7) }}|",
      "{{ 'hello world'|truncate(8, true, '..') }}{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true, "
      "true) }}",
      "{{ 'a.b.c'.rsplit('.', 1) }}{{ 'a\\r\\nb\\x0bc'.splitlines() }}{{ 'héllo'.find('l') }}{{ 'x'.zfill(3) "
      "}}",
      "{{ '%s|%5.1f|%-4d|%03d|%r' % ('a', 2.25, 7, 5, 'q') }}{{ '{:>6}|{:^5}|{!r}'.format('ab', 'c', 'd') }}",
      "{{ 'ß'.upper() }}{{ 'ǅ'.lower() }}{{ 'ÉCOLE'.lower() }}{{ 'straße'|title }}{{ 'άλφα'.upper() }}",
      "{{ '  \\u00a0x\\u3000 '.strip() }}|{{ 'a\\u2003b'.split() }}|{{ ' x '|trim }}|",
      "{% for k, v in d|dictsort(reverse=true) %}{{ k }}={{ v }};{% endfor %}{{ d|items|list }}",
      "{{ [1, 2, 3]|batch(2, 0)|list }}{{ range(7)|slice(3)|list }}{{ [1, 2, 3]|sum(start=10) }}",
      "{{ 'a' ~ nothing ~ 'b' }}{{ nothing|default('x') }}{{ nothing is iterable }}{{ nothing is sequence }}",
      "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{% endfor %}{{ x }}",
      "{% if true %}{% set y = 5 %}{% endif %}{{ y }}{% with z = 2 %}{{ z }}{% endwith %}{{ z }}",
      "{% set x %}  block {{ 1 }}\n{% endset %}[{{ x }}]{% filter upper %}abc{% endfilter %}",
      "{{ 1 is number }}{{ 1.0 is integer }}{{ true is number }}{{ 'a' is sequence }}{{ d is sequence }}"
      "{{ none is none }}{{ 1 is true }}{{ 2 is in [1, 2] }}{{ 6 is divisibleby 4 }}{{ 'aB' is lower }}",
      "{{ (1, 2) }}{{ (1,) }}{{ () }}{{ {'a': (1,)} }}{{ [[], {}] }}",
      "{{ 1 ~ 2 | string }}{{ 'ab' | upper ~ 'c' }}{{ -1|abs }}{{ not 1 == 2 }}{{ 'x' if 'a' in 'abc' }}",
      "{{ 3 // 2 * 2 }}{{ 2 * 3 % 4 }}{{ 1 + 2 ~ 3 }}{{ 'a' ~ 1 + 2 }}{{ 10 - 2 - 3 }}{{ 2 ** 2 ** 3 }}",
      "{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}{% for x in 'ab' %}{{ loop.cycle('-', '+') "
      "}}{{ x }}"
      "{% endfor %}",
      "{% for x in [1, 2, 3] %}{% if loop.changed(x > 1) %}c{% endif %}{{ x }}{% endfor %}",
      "{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}inner {{ 1 + 1 }}{% endcall %}",
      "{{ 'x'|replace('', '-') }}{{ 'abc'.replace('', '.', 2) }}{{ 'a,b'.split(',', 0) }}{{ ''.split() }}",
      "{{ '3'|int + 1 }}{{ ' 42 '|int }}{{ '1_000'|int }}{{ '1e3'|int }}{{ '1e3'|float }}{{ 'inf'|float }}",
      "{{ [0.5, 1.5, 2.5]|map('round')|list }}{{ 1.15|round(1) }}{{ 1234.5|round(-2) }}",
  };
  const ojson vars = {{"d", {{"b", {1, 2}}, {"a", 1}, {"c", nullptr}}}, {"s", "héllo wörld-foo (bar)"}};
  ojson cases = ojson::array();
  for (const auto& s : snippets)
    cases.push_back({{"template", s}, {"messages", ojson::array()}, {"extra", vars}, {"now", kNow}});
  const ojson expected = run_reference(cases);
  ASSERT_EQ(expected.size(), snippets.size());
  int mismatches = 0;
  for (size_t i = 0; i < snippets.size(); ++i) {
    std::string got;
    bool ok = true;
    try {
      ojson all = vars;
      all["messages"] = ojson::array();
      all["tools"] = nullptr;
      all["documents"] = nullptr;
      all["add_generation_prompt"] = true;
      got = render(snippets[i], all);
    } catch (const SwarmError& e) {
      ok = false;
      got = e.what();
    }
    const bool ref_ok = expected[i]["ok"].get<bool>();
    if (ok != ref_ok || (ok && got != expected[i]["output"].get<std::string>())) {
      ++mismatches;
      ADD_FAILURE() << "snippet: " << snippets[i] << "\n  python: "
                    << (ref_ok ? ojson(expected[i]["output"]).dump()
                               : expected[i]["error"].get<std::string>())
                    << "\n  c++:    " << (ok ? ojson(got).dump() : got);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << snippets.size() << " snippets";
}

}  // namespace
}  // namespace swarm::jinja
