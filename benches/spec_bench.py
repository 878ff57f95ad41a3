"""Speculative decoding's decode speed, ours against llama-server, on one GGUF (run by
benches/run-spec-bench.sh, which builds both and passes their paths). Not a test.

Workloads, all greedy chat requests:
- edit-*: an agent edit: a generated Python file of 100-300 lines in the prompt, an instruction
  to change one thing and return the whole file (what agents ask of a model all the time, and
  what prompt lookup drafts well);
- free-*: free-form answers (prose the context does not contain: drafts are rare and poor);
- tool-call: a turn that answers with an edit tool call quoting the context.

Per round, each server runs alone (one at a time on the machine): radix-serve with
`--spec-type ngram` (`SPEC_TYPE`, e.g. `draft-mtp` on a model with an MTP head), every request sent with speculation on and opted out (`speculative: false`)
alternately; llama-server with `--spec-type ngram-mod` (`LLAMA_SPEC_TYPE`) and without speculation. The best
round's decode rate (generated tokens / decode time, from each server's `timings`) counts.
Greedy output with and without our speculation must be the same text: a difference fails.

Then, ours only (to decide whether speculation may be on by default): the free-form and
tool-call requests sent all at once, with speculation and opted out, counted as generated tokens
of all of them per second of wall time (several sequences decode in one batch, where every
rejected draft row costs the others time).
"""

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(__file__))
from bench_http import free_port, post, wait_healthy  # noqa: E402

OURS, LLAMA, MODEL, OUT = sys.argv[1:5]
THREADS = os.environ.get("THREADS", "2")
ROUNDS = int(os.environ.get("ROUNDS", "2"))
EDIT_TOKENS = int(os.environ.get("EDIT_TOKENS", "1024"))
FREE_TOKENS = int(os.environ.get("FREE_TOKENS", "300"))
WORKLOADS = os.environ.get("WORKLOADS", "")
# Where drafts come from: ours `ngram`, `draft-mtp` or both; llama-server's own spelling.
SPEC_TYPE = os.environ.get("SPEC_TYPE", "ngram")
LLAMA_SPEC_TYPE = os.environ.get("LLAMA_SPEC_TYPE", "ngram-mod")
CTX = "8192"


def python_file(seed, functions):
    """A made-up Python module of `functions` small functions (about 8 lines each), ours, so no
    third-party text is needed: names, constants and arithmetic vary with `seed`."""
    nouns = ["order", "invoice", "item", "customer", "shipment", "payment", "refund", "coupon", "basket", "ledger"]
    verbs = ["compute", "validate", "format", "apply", "collect", "merge", "split", "summarize", "convert", "check"]
    lines = ['"""Order processing helpers."""', "", "import math", "from dataclasses import dataclass", "", ""]
    lines += ["@dataclass", "class Record:", "    name: str", "    amount: float", "    quantity: int", "", ""]
    for i in range(functions):
        verb, noun = verbs[(i * 7 + seed) % len(verbs)], nouns[(i * 3 + seed) % len(nouns)]
        name = f"{verb}_{noun}_{i}"
        k = (i * 13 + seed) % 9 + 2
        lines += [
            f"def {name}(records, rate={k / 10:.1f}):",
            f'    """{verb.capitalize()} the {noun} amounts of `records` at `rate`."""',
            "    total = 0.0",
            "    for record in records:",
            f"        if record.quantity > {k}:",
            f"            total += record.amount * rate * {k}",
            "        else:",
            "            total += math.floor(record.amount / rate)",
            "    return round(total, 2)",
            "",
            "",
        ]
    return "\n".join(lines), [f"{verbs[(i * 7 + seed) % len(verbs)]}_{nouns[(i * 3 + seed) % len(nouns)]}_{i}" for i in range(functions)]


def edit(seed, functions, instruction):
    text, names = python_file(seed, functions)
    target = names[len(names) // 4]
    content = (
        f"Here is `orders.py`:\n\n```python\n{text}\n```\n\n"
        + instruction.format(target=target)
        + " Reply with the complete updated file in one code block and nothing else."
    )
    return {"messages": [{"role": "user", "content": content}], "max_tokens": EDIT_TOKENS}


def tool_call():
    text, names = python_file(5, 14)
    tools = [{"type": "function", "function": {
        "name": "edit_file",
        "description": "Replace an exact snippet of a file with new text.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "old_string": {"type": "string"}, "new_string": {"type": "string"}},
            "required": ["path", "old_string", "new_string"]}}}]
    content = (f"`src/shop/orders.py`:\n\n```python\n{text}\n```\n\nIn `{names[4]}`, the loop should skip records "
               "whose quantity is 0. Make the edit with the edit_file tool, quoting the whole loop as old_string.")
    return {"messages": [{"role": "user", "content": content}], "tools": tools, "max_tokens": 400}


def free(question):
    system = {"role": "system", "content": "You are a helpful assistant."}
    return {"messages": [system, {"role": "user", "content": question}], "max_tokens": FREE_TOKENS}


def workloads():
    all_ = {
        "edit-rename-120": edit(1, 10, "Rename the function `{target}` to `{target}_v2`."),
        "edit-round-200": edit(2, 17, "Rewrite the whole file with this change: `{target}` must round to 4 digits "
                               "instead of 2. Output every line of the file, unchanged lines included."),
        "edit-delete-300": edit(3, 26, "Delete the function `{target}`."),
        "free-code": free("Write a Python function that reads a CSV file of sales records and returns the total "
                          "per region. Explain how it works, step by step."),
        "free-essay": free("Write a 300-word essay on why code review matters in a software team."),
        "free-story": free("Tell me a story about a robot who learns to paint."),
        "tool-call": tool_call(),
    }
    wanted = WORKLOADS.split() if WORKLOADS else list(all_)
    return {k: v for k, v in all_.items() if k in wanted}


def start(cmd, log, what):
    port = free_port()
    proc = subprocess.Popen(cmd + ["--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, what, proc)
    return proc, base


def ask(base, body, extra):
    request = dict(body, temperature=0, cache_prompt=True, **extra)
    answer = post(base, "/v1/chat/completions", request, timeout=3600)
    t = answer.get("timings", {})
    message = answer["choices"][0]["message"]
    text = message.get("content") or ""
    # A call's id is random; what the model wrote is the name and the arguments.
    for call in message.get("tool_calls") or []:
        text += json.dumps(call.get("function"), sort_keys=True)
    n, ms = t.get("predicted_n", 0), t.get("predicted_ms", 0.0)
    return {"text": text, "tokens": n, "decode_tps": (n - 1) * 1000.0 / ms if n > 1 and ms > 0 else 0.0,
            "draft_n": t.get("draft_n", 0), "draft_n_accepted": t.get("draft_n_accepted", 0)}


def at_once(base, bodies, extra):
    """Sends `bodies` together; returns generated tokens per second of wall time and the texts."""
    start = time.monotonic()
    with ThreadPoolExecutor(len(bodies)) as pool:
        runs = list(pool.map(lambda body: ask(base, body, extra), bodies))
    seconds = time.monotonic() - start
    return {"tps": sum(r["tokens"] for r in runs) / seconds, "texts": [r["text"] for r in runs],
            "draft_n": sum(r["draft_n"] for r in runs), "draft_n_accepted": sum(r["draft_n_accepted"] for r in runs)}


def main():
    os.makedirs(OUT, exist_ok=True)
    loads = workloads()
    arms = {
        "ours": ([OURS, "-m", MODEL, "-t", THREADS, "-c", CTX, "-np", "4", "--spec-type", SPEC_TYPE],
                 {"plain": {"speculative": False}, "spec": {}}),
        "llama-spec": ([LLAMA, "-m", MODEL, "-t", THREADS, "-c", CTX, "-np", "1", "--spec-type", LLAMA_SPEC_TYPE],
                       {"spec": {}}),
        "llama-plain": ([LLAMA, "-m", MODEL, "-t", THREADS, "-c", CTX, "-np", "1"], {"plain": {}}),
    }
    results = {}  # (server, mode, workload) -> list of runs
    for rnd in range(ROUNDS):
        for server, (cmd, modes) in arms.items():
            with open(os.path.join(OUT, f"{server}.log"), "a") as log:
                proc, base = start(cmd, log, f"spec-bench: {server} (see {OUT}/{server}.log)")
                try:
                    for name, body in loads.items():
                        ask(base, dict(body, max_tokens=1), modes[next(iter(modes))])  # the prompt cached
                        for mode, extra in modes.items():
                            run = ask(base, body, extra)
                            results.setdefault((server, mode, name), []).append(run)
                            print(f"spec-bench: round {rnd + 1} {server} {mode} {name}: {run['tokens']} tokens, "
                                  f"{run['decode_tps']:.1f} tok/s, drafts {run['draft_n_accepted']}/{run['draft_n']}",
                                  file=sys.stderr)
                    together = [b for n, b in loads.items() if not n.startswith("edit-")]
                    if server == "ours" and len(together) > 1:
                        for mode, extra in modes.items():
                            run = at_once(base, together, extra)
                            results.setdefault(("ours-at-once", mode), []).append(run)
                            print(f"spec-bench: round {rnd + 1} {len(together)} at once {mode}: {run['tps']:.1f} tok/s, "
                                  f"drafts {run['draft_n_accepted']}/{run['draft_n']}", file=sys.stderr)
                finally:
                    proc.terminate()
                    proc.wait()
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump({"|".join(k): v for k, v in results.items()}, f, indent=1)
    failed = False
    for name in loads:
        plain, spec = results[("ours", "plain", name)], results[("ours", "spec", name)]
        if any(p["text"] != s["text"] for p, s in zip(plain, spec)):
            print(f"spec-bench: {name}: our greedy output differs with speculation", file=sys.stderr)
            failed = True
    if ("ours-at-once", "spec") in results:
        for plain, spec in zip(results[("ours-at-once", "plain")], results[("ours-at-once", "spec")]):
            if plain["texts"] != spec["texts"]:
                print("spec-bench: at once: our greedy output differs with speculation", file=sys.stderr)
                failed = True
    isa = "AVX-512" if "avx512f" in open("/proc/cpuinfo").read() else "AVX2"
    best = lambda key: max(results[key], key=lambda r: r["decode_tps"])  # noqa: E731
    print(f"\nDecode tok/s, best of {ROUNDS} rounds, {THREADS} threads, {isa}, greedy, {os.path.basename(MODEL)}\n")
    print(f"| workload | tokens | ours plain | ours {SPEC_TYPE} | spec / plain | accepted | llama plain "
          f"| llama {LLAMA_SPEC_TYPE} | accepted | ours spec / llama spec |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in loads:
        op, os_ = best(("ours", "plain", name)), best(("ours", "spec", name))
        lp, ls = best(("llama-plain", "plain", name)), best(("llama-spec", "spec", name))
        print(f"| {name} | {os_['tokens']} | {op['decode_tps']:.1f} | {os_['decode_tps']:.1f} | "
              f"{os_['decode_tps'] / max(op['decode_tps'], 1e-9):.2f} | {os_['draft_n_accepted']}/{os_['draft_n']} | "
              f"{lp['decode_tps']:.1f} | {ls['decode_tps']:.1f} | {ls['draft_n_accepted']}/{ls['draft_n']} | "
              f"{os_['decode_tps'] / max(ls['decode_tps'], 1e-9):.2f} |")
    if ("ours-at-once", "spec") in results:
        p = max(results[("ours-at-once", "plain")], key=lambda r: r["tps"])
        s = max(results[("ours-at-once", "spec")], key=lambda r: r["tps"])
        print(f"\nOurs, the {len(p['texts'])} non-edit requests at once (-np 4): generated tok/s of all, "
              f"best of {ROUNDS}\n")
        print("| plain | spec | spec / plain | accepted |\n|---|---|---|---|")
        print(f"| {p['tps']:.1f} | {s['tps']:.1f} | {s['tps'] / max(p['tps'], 1e-9):.2f} | "
              f"{s['draft_n_accepted']}/{s['draft_n']} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
