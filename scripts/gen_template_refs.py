#!/usr/bin/env python3
"""Generate templates/tests/fixtures/reference_renders.json: what transformers renders for every
chat template x conversation fixture, recorded as sha256 + byte length (never the text, since the
third-party templates' output is not ours to commit).

CI never runs this script; it only reads the committed JSON. Run it by hand when a fixture, a
template or the pinned reference versions change, and commit the regenerated JSON.

Reference environment (pinned; recreate it with):

    python3.11 -m venv ~/.cache/radix-serve/refenv
    ~/.cache/radix-serve/refenv/bin/pip install \
        transformers==5.24.0 jinja2==3.1.6 gguf==0.19.0 tokenizers==0.23.3
    # PyTorch is not needed (transformers warns that it is missing; tokenizers suffice).

Usage (from the repository root):

    ~/.cache/radix-serve/refenv/bin/python scripts/gen_template_refs.py            # raw + prepared
    ~/.cache/radix-serve/refenv/bin/python scripts/gen_template_refs.py --modes raw

Inputs:
  templates/tests/fixtures/templates.json          template ids and sources:
      {"asset": NAME}  resolved with `scripts/assets.sh path NAME` (a tokenizer directory, a
                       .gguf file whose `tokenizer.chat_template` is the template, or a .jinja
                       file);
      {"file": PATH}   a .jinja file, PATH relative to templates/tests/fixtures/.
  templates/tests/fixtures/conversations/*.json    OpenAI chat-completions request bodies:
      messages, tools?, chat_template_kwargs?, add_generation_prompt? (default true, as vLLM),
      continue_final_message? (default false; when true, add_generation_prompt is forced false).

Modes:
  raw       the fixture as given.
  prepared  the fixture after our message preparation: `radix-serve template --template SRC
            --request FIXTURE --emit prepared-request` prints the prepared request as JSON
            ({messages, tools, add_generation_prompt, continue_final_message,
            chat_template_kwargs}), which is then rendered exactly like a raw fixture. SRC is the
            tokenizer_config.json path, the .gguf path or the .jinja path.

How a fixture is rendered (mirrors `tokenizer.apply_chat_template(conversation, tools=...,
add_generation_prompt=..., continue_final_message=..., tokenize=False, **chat_template_kwargs)`):
  * tokenizer directories: AutoTokenizer.from_pretrained(dir).apply_chat_template(...) itself
    (it drops None-valued message keys and passes special_tokens_map as template variables);
  * GGUF files and .jinja files: the same steps by hand: `_normalize_chat_messages`, then
    `render_jinja_template(conversations=[msgs], tools=..., chat_template=...,
    add_generation_prompt=..., continue_final_message=..., **{**special_tokens, **kwargs})` with
    special_tokens = {bos_token, eos_token} from the GGUF metadata, and {} for .jinja files.

Output entries, one per (template, fixture, mode), sorted by those three keys:
  {"template", "fixture", "mode", "ok",
   "sha256", "len"            (ok only: sha256 hex and byte length of the UTF-8 render),
   "error", "error_kind"}     (not ok only: str() of the exception; "template" when it is exactly
                               jinja2.exceptions.TemplateError, which is what the template's
                               raise_exception() raises, "other" for anything else, including
                               TemplateError subclasses such as UndefinedError)
Error strings that transformers builds from the rendered chat (continue_final_message checks)
are cut before the rendered text, so no render is ever stored.
The file is deterministic: running the script twice gives identical bytes.
A summary table (per template and mode: ok/failed, distinct errors) is printed to stderr.
"""

import argparse
import copy
import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PINNED = {"transformers": "5.24.0", "jinja2": "3.1.6", "gguf": "0.19.0"}

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "templates" / "tests" / "fixtures"
CONVERSATIONS = FIXTURES / "conversations"
TEMPLATES_JSON = FIXTURES / "templates.json"
DEFAULT_OUTPUT = FIXTURES / "reference_renders.json"
DEFAULT_BINARY = REPO / "target" / "debug" / "radix-serve"
MODES = ("raw", "prepared")


def die(msg):
    print(f"gen_template_refs: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    import gguf
    import jinja2
    import transformers
    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template
except ImportError as e:  # pragma: no cover
    die(f"{e}. Run this with the reference venv (see the top of this script for how to create it).")


# ----------------------------------------------------------------------------------------------
# Template sources


def asset_path(name):
    try:
        out = subprocess.run(
            [str(REPO / "scripts" / "assets.sh"), "path", name],
            check=True, capture_output=True, text=True,
        )
    except subprocess.CalledProcessError as e:
        die(f"scripts/assets.sh path {name} failed:\n{e.stderr}")
    return Path(out.stdout.strip().splitlines()[-1])


def gguf_template(path):
    reader = gguf.GGUFReader(str(path))
    fields = reader.fields

    def get(key):
        if key not in fields:
            die(f"{path}: GGUF metadata has no {key}")
        return fields[key]

    template = get("tokenizer.chat_template").contents()
    tokens = get("tokenizer.ggml.tokens")
    special = {
        "bos_token": tokens.contents(int(get("tokenizer.ggml.bos_token_id").contents())),
        "eos_token": tokens.contents(int(get("tokenizer.ggml.eos_token_id").contents())),
    }
    return template, special


class Renderer:
    """One template: `src` is the path handed to `radix-serve template --template`."""

    def __init__(self, template_id, source):
        self.id = template_id
        self.tokenizer = None
        self.template = None
        self.special = {}
        if "asset" in source:
            path = asset_path(source["asset"])
            if path.is_dir():
                self.tokenizer = AutoTokenizer.from_pretrained(str(path))
                self.src = path / "tokenizer_config.json"
            elif path.suffix == ".gguf":
                self.template, self.special = gguf_template(path)
                self.src = path
            elif path.suffix == ".jinja":
                # A bare template asset, rendered like a {"file": ...} source: no special tokens,
                # as `radix-serve template` reads a .jinja file.
                self.template = path.read_text(encoding="utf-8")
                self.src = path
            else:
                die(f"asset {source['asset']}: {path} is neither a tokenizer directory, a .gguf nor a .jinja file")
        elif "file" in source:
            self.src = FIXTURES / source["file"]
            self.template = self.src.read_text(encoding="utf-8")
        else:
            die(f"template {template_id}: unknown source {source!r}")

    def render(self, request):
        messages = copy.deepcopy(request["messages"])
        tools = copy.deepcopy(request.get("tools"))
        kwargs = copy.deepcopy(request.get("chat_template_kwargs") or {})
        continue_final = bool(request.get("continue_final_message", False))
        add_gen = bool(request.get("add_generation_prompt", True)) and not continue_final
        if self.tokenizer is not None:
            return self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=add_gen,
                continue_final_message=continue_final, tokenize=False, **kwargs,
            )
        # The steps of apply_chat_template, for a template that has no tokenizer object.
        if not messages:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        msgs = _normalize_chat_messages(messages)
        if continue_final and add_gen:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
        rendered, _ = render_jinja_template(
            conversations=[msgs], tools=tools, chat_template=self.template,
            add_generation_prompt=add_gen, continue_final_message=continue_final,
            **{**self.special, **kwargs},
        )
        return rendered[0]


# ----------------------------------------------------------------------------------------------
# Fixtures and modes


def load_fixtures():
    paths = sorted(CONVERSATIONS.glob("*.json"))
    if not paths:
        die(f"no fixtures in {CONVERSATIONS}")
    return [(p.stem, p, json.loads(p.read_text(encoding="utf-8"))) for p in paths]


def prepared_request(binary, renderer, fixture_path):
    cmd = [str(binary), "template", "--template", str(renderer.src), "--request", str(fixture_path),
           "--emit", "prepared-request"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited with {proc.returncode}:\n{proc.stderr.strip()}")
    try:
        request = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"`{' '.join(cmd)}` printed invalid JSON ({e})")
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        raise RuntimeError(f"`{' '.join(cmd)}` printed JSON without a messages list")
    return request


def describe_error(e):
    msg = str(e)
    # transformers' continue_final_message errors quote the rendered chat; never store it.
    cut = msg.find("Rendered chat:")
    if cut >= 0:
        msg = msg[:cut].rstrip() + " [rendered chat omitted]"
    kind = "template" if type(e) is jinja2.exceptions.TemplateError else "other"
    return msg, kind


def entry(template_id, fixture, mode, render):
    out = {"template": template_id, "fixture": fixture, "mode": mode}
    try:
        text = render()
    except Exception as e:  # every failure is data
        msg, kind = describe_error(e)
        out.update(ok=False, error=msg, error_kind=kind)
        return out
    if not isinstance(text, str):
        out.update(ok=False, error=f"render returned {type(text).__name__}, not str", error_kind="other")
        return out
    data = text.encode("utf-8")
    out.update(ok=True, sha256=hashlib.sha256(data).hexdigest(), len=len(data))
    return out


# ----------------------------------------------------------------------------------------------
# Summary


def print_summary(entries, modes):
    by_template = defaultdict(list)
    for e in entries:
        by_template[e["template"]].append(e)
    err = sys.stderr
    print(f"\n{'template':<20} " + " ".join(f"{m + ' ok/failed':>18}" for m in modes), file=err)
    for template_id in sorted(by_template):
        rows = by_template[template_id]
        cells = []
        for m in modes:
            ok = sum(1 for e in rows if e["mode"] == m and e["ok"])
            bad = sum(1 for e in rows if e["mode"] == m and not e["ok"])
            cells.append(f"{ok:>12}/{bad:<5}")
        print(f"{template_id:<20} " + " ".join(cells), file=err)
    for template_id in sorted(by_template):
        for m in modes:
            errors = defaultdict(list)
            for e in by_template[template_id]:
                if e["mode"] == m and not e["ok"]:
                    errors[(e["error_kind"], e["error"])].append(e["fixture"])
            for (kind, msg), fixtures in sorted(errors.items()):
                short = msg if len(msg) <= 160 else msg[:157] + "..."
                print(f"\n  {template_id} [{m}] {kind}: {short!r}", file=err)
                print(f"    {', '.join(fixtures)}", file=err)
    print(file=err)


# ----------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="raw,prepared",
                    help="comma-separated modes to run: raw, prepared (default: both)")
    ap.add_argument("--binary", type=Path, default=DEFAULT_BINARY,
                    help="radix-serve binary for the prepared mode (default: target/debug/radix-serve)")
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT,
                    help="where to write the JSON (default: templates/tests/fixtures/reference_renders.json)")
    ap.add_argument("--any-version", action="store_true",
                    help="run even if transformers/jinja2/gguf differ from the pinned versions")
    args = ap.parse_args()

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        die(f"--modes takes a comma-separated subset of {','.join(MODES)}, got {args.modes!r}")
    modes = [m for m in MODES if m in modes]

    found = {"transformers": transformers.__version__, "jinja2": jinja2.__version__,
             "gguf": importlib.metadata.version("gguf")}
    wrong = {k: v for k, v in found.items() if v != PINNED[k]}
    if wrong and not args.any_version:
        die(f"reference versions differ from the pins {PINNED}: {wrong} (use --any-version to run anyway)")

    if "prepared" in modes and not (args.binary.is_file() and os.access(args.binary, os.X_OK)):
        die(f"prepared mode needs the radix-serve binary, but {args.binary} is missing or not executable.\n"
            "Build it with `cargo build -p radix-serve` (or pass --binary), or run --modes raw.")

    templates = json.loads(TEMPLATES_JSON.read_text(encoding="utf-8"))
    ids = [t["id"] for t in templates]
    if len(set(ids)) != len(ids):
        die("duplicate template ids in templates.json")
    renderers = [Renderer(t["id"], t["source"]) for t in sorted(templates, key=lambda t: t["id"])]
    fixtures = load_fixtures()

    entries = []
    prepare_failures = []
    for r in renderers:
        for name, path, body in fixtures:
            if "raw" in modes:
                entries.append(entry(r.id, name, "raw", lambda: r.render(body)))
            if "prepared" in modes:
                try:
                    request = prepared_request(args.binary, r, path)
                except (RuntimeError, OSError) as e:
                    prepare_failures.append(f"{r.id} x {name}: {e}")
                    continue
                entries.append(entry(r.id, name, "prepared", lambda: r.render(request)))

    if prepare_failures:
        print("gen_template_refs: `radix-serve template --emit prepared-request` failed; nothing written:",
              file=sys.stderr)
        for f in prepare_failures:
            print(f"  {f}", file=sys.stderr)
        sys.exit(1)

    entries.sort(key=lambda e: (e["template"], e["fixture"], MODES.index(e["mode"])))
    doc = {"transformers": found["transformers"], "jinja2": found["jinja2"], "entries": entries}
    text = json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=True) + "\n"
    args.output.write_text(text, encoding="utf-8")
    print_summary(entries, modes)
    print(f"wrote {len(entries)} entries ({', '.join(modes)}) to {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
