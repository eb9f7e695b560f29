#!/usr/bin/env python3
"""The reference of lattice's chat templates: Python's jinja2 (Debian's python3-jinja2) configured as
HuggingFace transformers' apply_chat_template configures it: a sandboxed environment with trim_blocks
and lstrip_blocks, the loop controls, a `generation` block that renders its body, tojson as
json.dumps(ensure_ascii=False, ...), and the globals raise_exception and strftime_now.

usage: chat_template_reference.py render CASES.jsonl > expected.jsonl
         one line per case: {"text": S}, {"raised": MESSAGE} (raise_exception) or {"failed": true}
       chat_template_reference.py compare CASES.jsonl EXPECTED.jsonl GOT.jsonl
         prints each case whose lines differ (model, case, where the texts part) and the counts;
         exit 1 if any differ
"""
import datetime
import json
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Raised(Exception):
    pass


class GenerationBlock(Extension):
    """{% generation %}...{% endgeneration %}: transformers marks the assistant's text with it."""
    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, "jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise Raised(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def render(cases_path):
    env = environment()
    for line in open(cases_path, encoding="utf-8"):
        case = json.loads(line)
        try:
            out = {"text": env.from_string(case["template"]).render(**case["variables"])}
        except Raised as e:
            out = {"raised": str(e)}
        except Exception as e:  # noqa: BLE001 - any other template error
            out = {"failed": True}
        print(json.dumps(out, ensure_ascii=False))


def compare(cases_path, expected_path, got_path):
    cases = [json.loads(l) for l in open(cases_path, encoding="utf-8")]
    expected = [json.loads(l) for l in open(expected_path, encoding="utf-8")]
    got = [json.loads(l) for l in open(got_path, encoding="utf-8")]
    if not (len(cases) == len(expected) == len(got)):
        print(f"{len(cases)} cases, {len(expected)} expected lines, {len(got)} rendered lines")
        return 1
    bad = 0
    for i, (c, e, g) in enumerate(zip(cases, expected, got)):
        if e == g:
            continue
        bad += 1
        where = ""
        if "text" in e and "text" in g:
            a, b = e["text"], g["text"]
            k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            where = f": texts part at {k}: jinja2 {a[k:k + 40]!r}, lattice {b[k:k + 40]!r}"
        else:
            where = f": jinja2 {json.dumps(e, ensure_ascii=False)[:120]}, lattice {json.dumps(g, ensure_ascii=False)[:120]}"
        print(f"case {i + 1} ({c['model']}){where}")
    kinds = {k: sum(1 for e in expected if k in e) for k in ("text", "raised", "failed")}
    print(f"{len(cases) - bad} of {len(cases)} cases as jinja2 renders them ({kinds['text']} texts, "
          f"{kinds['raised']} raise_exception, {kinds['failed']} other errors expected)")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "render":
        render(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "compare":
        sys.exit(compare(*sys.argv[2:]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
