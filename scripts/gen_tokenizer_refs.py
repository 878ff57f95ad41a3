#!/usr/bin/env python3
"""Generate the tokenizer test fixtures of the models crate:

  models/tests/fixtures/tokenizer_corpus.json   the corpus below (our own text, written for these tests)
  models/tests/fixtures/tokenizer_refs.json     the token ids transformers produces for every corpus
                                                string, per tokenizer (ids only, no third-party text)

CI never runs this script; it only reads the committed JSON. Run it by hand when the corpus, an
asset or the pinned reference versions change, and commit the regenerated JSON.

Reference environment (pinned; recreate it with):

    python3.11 -m venv ~/.cache/radix-serve/refenv
    ~/.cache/radix-serve/refenv/bin/pip install \
        transformers==5.24.0 jinja2==3.1.6 gguf==0.19.0 tokenizers==0.23.3
    # PyTorch is not needed (see "torch" below).

Usage (from the repository root):

    ~/.cache/radix-serve/refenv/bin/python scripts/gen_tokenizer_refs.py

Tokenizers recorded (each entry of tokenizer_refs.json["tokenizers"]):

  smollm2_gguf        SmolLM2-135M-Instruct's GGUF (`scripts/assets.sh path smollm2`), loaded by
                      transformers from the GGUF file (`gguf_file=`), i.e. its own GGUF tokenizer
                      conversion (tokenizer.ggml.model "gpt2", tokenizer.ggml.pre "smollm").
  qwen3               Qwen3's tokenizer.json (`scripts/assets.sh path qwen3`), AutoTokenizer.
  qwen3_gguf_style    Qwen3's vocabulary, merges and added tokens rewritten as GGUF metadata would
                      hold them (tokenizer.ggml.model "gpt2", tokenizer.ggml.pre "qwen2", token_type
                      3 for special added tokens and 4 for the others) and built by transformers'
                      GGUF conversion (`convert_gguf_tokenizer`). This pins our "qwen2" pre-tokenizer
                      without a Qwen GGUF asset. Differs from `qwen3` only where Qwen3's NFC
                      normalizer matters (a GGUF carries no normalizer).
  llama3_1            Llama 3.1's tokenizer.json (`scripts/assets.sh path llama3_1`), AutoTokenizer.
  llama3_1_gguf_style as qwen3_gguf_style, with tokenizer.ggml.pre "llama-bpe".
  deepseek_v3         DeepSeek-V3's tokenizer.json + tokenizer_config.json, AutoTokenizer (its config
                      asks for a BOS its post-processor does not add).
  gemma3              Gemma 3's tokenizer.json (`scripts/assets.sh path gemma3`), AutoTokenizer: a
                      SentencePiece-style BPE with byte fallback.

For each corpus string: `plain` = ids with add_special_tokens=False, `with_special` = ids with
add_special_tokens=True (a BOS where the tokenizer adds one). Special tokens written in the text
(`<|im_start|>`) are matched as single tokens, as transformers does for added tokens.

torch: transformers' GGUF reader module imports torch at the top (for tensor dtypes), and
AutoTokenizer's GGUF path builds a model config that needs torch for a "llama" architecture. Neither
touches the tokenizer, so we install an empty stand-in `torch` module after transformers is imported
and load the GGUF tokenizer with `PreTrainedTokenizerFast.from_pretrained(dir, gguf_file=name)`,
which runs the same `get_gguf_tokenizer` + `convert_gguf_tokenizer` as AutoTokenizer does.
"""

import argparse
import importlib.metadata
import json
import subprocess
import sys
import types
from pathlib import Path

PINNED = {"transformers": "5.24.0", "tokenizers": "0.23.3", "gguf": "0.19.0"}
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "models/tests/fixtures"

# Our own corpus. Keep every string original (no third-party text).
CORPUS = [
    "",
    "Hello",
    "Hello, world!",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "   ",
    "\t",
    "a\tb\t\tc",
    "line one\nline two\n\nline four",
    "\n\n\n",
    "windows\r\nline endings\r\n",
    "mixed \t \n whitespace \n\t run",
    "word    with     long      gaps",
    "The quick brown fox sketches a lazy otter near the river bank.",
    "It's, we're, they've, I'm, you'll, he'd, IT'S LOUD",
    "punctuation!!! ... ??? --- ;;; ::: (((nested))) [[x]] {{y}}",
    "x = 1; y = 22; z = 333; w = 4444;",
    "12345678901234567890",
    "3.14159265358979 and 2.71828 and -0.5e-10",
    "a  1",
    "x\t 42 and  7",
    "Phone: +1 (555) 010-9999, ext. 0042",
    "Order #98765 shipped on 2026-11-29 at 14:05:59Z",
    "0x1F 0b1010 0o777 1_000_000",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * i).collect();\n    println!(\"{v:?}\");\n}\n",
    "impl<T: Clone + Send> Pool<T> {\n\tpub fn get(&self, idx: usize) -> Option<&T> { self.items.get(idx) }\n}",
    "#[derive(Debug)]\nstruct Page { id: u64, tokens: [u32; 16] }",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "if __name__ == \"__main__\":\n    print(sorted({3, 1, 2}, reverse=True))",
    "    indented four\n        indented eight",
    "SELECT id, name FROM pages WHERE refcount > 0 ORDER BY id DESC;",
    "{\"role\": \"user\", \"content\": \"hi\", \"n\": [1, 2, 3]}",
    "<div class=\"box\">café &amp; crème</div>",
    "https://example.invalid/path?q=radix+tree&page=2#top",
    "snake_case_name camelCaseName SCREAMING_CASE kebab-case-name",
    "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n",
    "<|im_start|>user\nHow many pages are cached?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nSum 17 and 25.<|im_end|>\n<|im_start|>assistant\n42<|im_end|>\n",
    "<|im_start|><|im_end|>",
    "text<|im_end|>glued<|im_start|>together",
    " <|im_start|> spaced <|im_end|> ",
    "<|endoftext|>",
    "<|im_start|>assistant\n<think>\nShort thought.\n</think>\n\nAnswer.<|im_end|>",
    "<|im_start not a token|> and <|im_end",
    "日本語のテキストを分割します。",
    "中文分词测试：基数树缓存前缀。",
    "한국어 문장도 시험합니다.",
    "混合 mixed 文字 text 123 数字",
    "😀",
    "Emoji run: 😀😃😄😁🚀🔥",
    "Family: 👨‍👩‍👧‍👦 and flags 🇯🇵 🇫🇷",
    "Skin tones: 👋🏽 👍🏿 and ZWJ 🧑‍💻 🏳️‍🌈",
    "Keycaps 1️⃣ 2️⃣ #️⃣",
    "مرحبا بالعالم",
    "שלום עולם",
    "RTL mixed: العربية with English و 123",
    "Crème brûlée, naïve façade, São Paulo, Łódź, Ærøskøbing",
    "Ünïcödé äccents ÀÉÎÕÜ ñ ß ğ ş ı",
    "Cafe\u0301 with a combining accent",
    "Greek: αβγδε ΑΒΓΔΕ, Cyrillic: привет мир",
    "Math: ∀x ∈ ℝ, x² ≥ 0 → √x ∈ ℝ⁺ ∪ {0}",
    "Box drawing ┌─┐│└┘ and arrows ←↑→↓",
    "Zero\u200bwidth\u200bspace and no\u00a0break\u00a0space",
    "Tab\tseparated\tvalues\n1\t2\t3\n",
    "A" * 64,
    "ab" * 40,
    "🙂" * 12,
    "The cache holds 4096 pages of 16 tokens; 65536 tokens fit in total.",
    "“Curly quotes” and ‘single’ ones — plus an em dash – and an en dash…",
]

TOKENIZERS = [
    "smollm2_gguf", "qwen3", "qwen3_gguf_style", "llama3_1", "llama3_1_gguf_style", "deepseek_v3", "gemma3",
]


def die(message):
    print(f"gen_tokenizer_refs.py: {message}", file=sys.stderr)
    sys.exit(1)


def asset(name):
    out = subprocess.run(["bash", str(ROOT / "scripts/assets.sh"), "path", name], capture_output=True, text=True)
    if out.returncode != 0:
        die(f"scripts/assets.sh path {name} failed:\n{out.stderr}")
    return Path(out.stdout.strip())


def stub_torch():
    """An empty `torch` whose every attribute is a fresh class (see the module docstring)."""

    class _Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {})

    sys.modules["torch"] = _Stub("torch")


def gguf_style_dict(tokenizer_dir, pre):
    """The `tokenizer_dict` transformers' GGUF reader would return for a GGUF holding this
    tokenizer.json's byte-level BPE (the same construction as the Rust tests' helper)."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = data["model"]
    if model["type"] != "BPE":
        die(f"{tokenizer_dir}: not a BPE tokenizer")
    by_id = {index: token for token, index in model["vocab"].items()}
    token_type = {}
    for added in data["added_tokens"]:
        by_id[added["id"]] = added["content"]
        token_type[added["id"]] = 3 if added["special"] else 4
    size = max(by_id) + 1
    if len(by_id) != size:
        die(f"{tokenizer_dir}: token ids are not dense")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return {
        "tokenizer_type": "gpt2",
        "pre_tokenizer_type": pre,
        "tokens": [by_id[i] for i in range(size)],
        "token_type": [token_type.get(i, 1) for i in range(size)],
        "merges": merges,
    }


def load(name):
    """(encode(text, add_special_tokens) -> ids) for one recorded tokenizer."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if name == "smollm2_gguf":
        path = asset("smollm2")
        tok = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
        return lambda text, special: tok(text, add_special_tokens=special)["input_ids"]
    if name in ("qwen3", "llama3_1", "deepseek_v3", "gemma3"):
        tok = AutoTokenizer.from_pretrained(str(asset(name)))
        return lambda text, special: tok(text, add_special_tokens=special)["input_ids"]
    if name.endswith("_gguf_style"):
        from transformers.integrations.gguf import convert_gguf_tokenizer

        base, pre = {"qwen3_gguf_style": ("qwen3", "qwen2"), "llama3_1_gguf_style": ("llama3_1", "llama-bpe")}[name]
        backend, _ = convert_gguf_tokenizer("gguf-style", gguf_style_dict(asset(base), pre))
        # No BOS is configured for these (the Rust side is given no add_bos_token key either).
        return lambda text, special: backend.encode(text, add_special_tokens=special).ids
    die(f"unknown tokenizer {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--allow-version-mismatch", action="store_true",
                        help="run even if transformers/tokenizers/gguf differ from the pinned versions")
    args = parser.parse_args()
    found = {pkg: importlib.metadata.version(pkg) for pkg in PINNED}
    if found != PINNED and not args.allow_version_mismatch:
        die(f"reference versions {found} differ from the pinned {PINNED}")

    import transformers  # noqa: F401  (imported before the torch stand-in, which it must not see)

    stub_torch()
    if len(set(CORPUS)) != len(CORPUS):
        die("corpus has duplicate strings")

    refs = {}
    for name in TOKENIZERS:
        encode = load(name)
        refs[name] = [{"plain": encode(text, False), "with_special": encode(text, True)} for text in CORPUS]
        print(f"{name}: {sum(len(r['plain']) for r in refs[name])} tokens over {len(CORPUS)} strings")

    FIXTURES.mkdir(parents=True, exist_ok=True)
    corpus_doc = {"_comment": "Written for radix-serve's tokenizer tests by scripts/gen_tokenizer_refs.py.",
                  "strings": CORPUS}
    (FIXTURES / "tokenizer_corpus.json").write_text(json.dumps(corpus_doc, ensure_ascii=False, indent=1) + "\n",
                                                     encoding="utf-8")
    refs_doc = {
        "_comment": "Token ids from transformers for tokenizer_corpus.json; regenerate with "
                    "scripts/gen_tokenizer_refs.py.",
        "versions": found,
        "tokenizers": refs,
    }
    text = json.dumps(refs_doc, indent=None, separators=(",", ":"))
    # One corpus string per line keeps diffs readable.
    text = text.replace('{"plain"', '\n{"plain"')
    (FIXTURES / "tokenizer_refs.json").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
