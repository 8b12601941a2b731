#!/usr/bin/python3
"""Reference renderer for chat templates (used by tests/unit/text/test_chat_template.cpp).

Renders with Python's jinja2 configured the way Hugging Face transformers'
apply_chat_template(..., tokenize=False) configures it:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loop-controls
extension and a {% generation %} tag, a `tojson` filter that is json.dumps(x,
ensure_ascii=False, ...), and the raise_exception / strftime_now globals.

stdin: one case object or a list of them:
  {"template": str, "bos_token": str, "eos_token": str, "messages": [...], "tools": [...]|null,
   "add_generation_prompt": bool, "extra": {...}, "now": epoch seconds (optional, fixes
   strftime_now)}
stdout: a JSON list (or object, for a single case) of {"ok": true, "output": str} or
  {"ok": false, "error": "ExceptionType: message"}.
Run it with Debian's /usr/bin/python3 (python3-jinja2).
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as exc:  # pragma: no cover - environment problem
    sys.stderr.write("render_chat_template.py: cannot import jinja2 (%s); install python3-jinja2\n" % exc)
    sys.exit(2)


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: renders its body, as HF's AssistantTracker does
    when no assistant mask is requested."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_environment(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        moment = datetime.fromtimestamp(now) if now is not None else datetime.now()
        return moment.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


_compiled = {}


def compile_template(source, now):
    # Compiling is the slow part; cases share a handful of templates.
    key = (source, now)
    if key not in _compiled:
        _compiled[key] = make_environment(now).from_string(source)
    return _compiled[key]


def render(case):
    template = compile_template(case["template"], case.get("now"))
    context = {}
    # Like HF's special_tokens_map: only tokens that are set.
    for name in ("bos_token", "eos_token"):
        if case.get(name):
            context[name] = case[name]
    context.update(case.get("extra") or {})
    context.setdefault("documents", None)
    return template.render(messages=case["messages"], tools=case.get("tools"),
                           add_generation_prompt=case.get("add_generation_prompt", True), **context)


def run(case):
    try:
        return {"ok": True, "output": render(case)}
    except Exception as exc:  # every template failure is a result, not a crash
        return {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}


def main():
    data = json.loads(sys.stdin.read())
    if isinstance(data, list):
        result = [run(case) for case in data]
    else:
        result = run(data)
    sys.stdout.write(json.dumps(result))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
