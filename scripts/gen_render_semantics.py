#!/usr/bin/env python3
"""Generate templates/tests/fixtures/render_semantics.json: small templates of ours rendered by
transformers' own Jinja2 environment, pinning the Python semantics our minijinja setup must copy
(printing with str(), tojson options, string methods, tests, whitespace control, generation blocks).
Run with the reference venv described in scripts/gen_template_refs.py:

    ~/.cache/radix-serve/refenv/bin/python scripts/gen_render_semantics.py
"""
import json
from pathlib import Path
from transformers.utils.chat_template_utils import _compile_jinja_template
cases = [
 ("{{ none is iterable }} {{ 'ab' is iterable }} {{ {} is iterable }} {{ 'ab' is sequence }} {{ {'a': 1} is sequence }} {{ 3 is sequence }}", {}),
 ("{{ x }}|{{ y }}|{{ z }}|{{ n }}|{{ f }}|{{ e }}", {"x": True, "y": None, "z": [1, "a'b", {"k": False}], "n": 7, "f": 2.5, "e": 1e-7}),
 ("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(sort_keys=true) }}|{{ d | tojson(ensure_ascii=true) }}", {"d": {"b": [1, 2.0, "é</"], "a": None}}),
 ("{% set ns = namespace(n=0) %}{% for m in xs %}{% set ns.n = ns.n + m %}{% endfor %}{{ ns.n }}", {"xs": [1, 2, 3]}),
 ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.split() }}|{{ s.strip().split(' ', 1) }}|{{ s.startswith('  a') }}|{{ s.upper() }}|{{ s.replace('b', 'x') }}", {"s": "  a b c \n"}),
 ("{{ s | trim }}|{{ xs | join(', ') }}|{{ xs | length }}|{{ xs[::-1] }}|{{ xs[1:] }}|{{ d.get('k', 'dflt') }}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"s": "\t x \n", "xs": ["a", "b", "c"], "d": {"z": 1, "a": 2}}),
 ("{%- for m in xs %}\n  {{ m }}\n{%- endfor %}\n", {"xs": [1, 2]}),
 ("{% for m in xs %}\n    {% if m %}\n{{ m }}\n    {% endif %}\n{% endfor %}\nend\n", {"xs": [1, 0, 2]}),
 ("{{ (x ~ 'y') }}|{{ 'a' + 'b' }}|{{ xs | first }}|{{ xs | last }}|{{ '%d' | format(3) }}", {"x": 1, "xs": [3, 4]}),
 ("{% generation %}A{% endgeneration %}-{%- generation -%}  B  {%- endgeneration -%}", {}),
]
out=[]
for t, ctx in cases:
    try:
        r = _compile_jinja_template(t).render(**ctx)
        out.append({"template": t, "context": ctx, "expected": r})
    except Exception as e:
        out.append({"template": t, "context": ctx, "error": f"{type(e).__name__}: {e}"})
path = Path(__file__).resolve().parent.parent / "templates/tests/fixtures/render_semantics.json"
path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
print(f"wrote {len(out)} cases to {path}")
