"""Prefill and decode speed of radix-serve and llama-server on one GGUF, server to server over
HTTP `/completion`: each server started alone with the same threads, context and one slot; per
depth (512 and 2048 prompt tokens) one request of fresh token ids (`cache_prompt: false`, and
ids no earlier request began with, so neither server reuses a prefix) that prefills the prompt
and then decodes 32 tokens greedily (`ignore_eos`, so every reply has all 32). The figures are each server's own `timings`:
`prompt_per_second` (pp512, pp2048) and `predicted_per_second` (tg32 @ 512, tg32 @ 2048). The
servers alternate ROUNDS times; within a round each figure is the best of REPS requests, and
the table takes each server's best round (on a shared machine the least disturbed one). Prints
one JSON line per (server, round) and writes them all, with the table, to OUTDIR. Not a test.

    python3 benches/server_speed.py MODEL.gguf NAME OUTDIR [ROUNDS]

Environment: RADIX_SERVE (our binary), LLAMA_BIN (llama.cpp's bin directory, from
scripts/build-llama-cpp.sh), THREADS=2, CTX=8192, REPS=2, DEPTHS=512,2048, VOCAB=100000 (ids are
drawn below it; SmolLM2 needs 49152). A server that still ends a reply before 32 tokens is
named in the table: its decode figure then counts fewer tokens.
"""
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_http import free_port, post, stop, wait_healthy  # noqa: E402

DECODE_TOKENS = 32


def server_commands(model, threads, ctx):
    """Each server's command line: the same model, threads, context and one slot."""
    return {
        "radix-serve": [os.environ["RADIX_SERVE"], "-m", model, "-t", threads, "-c", ctx, "--parallel", "1"],
        "llama-server": [os.environ["LLAMA_BIN"] + "/llama-server", "-m", model, "-t", threads, "-c", ctx, "-np", "1"],
    }


def measure(base, depths, reps, vocab, rng):
    """The best `prompt_per_second` and `predicted_per_second` of `reps` requests per depth."""
    # A short first request, so that neither server's first figure pays for page faults.
    post(base, "/completion", {"prompt": [rng.randrange(vocab) for _ in range(64)], "n_predict": 4,
                               "temperature": 0, "cache_prompt": False})
    figures = {}
    for depth in depths:
        best_pp, best_tg, fewest = 0.0, 0.0, DECODE_TOKENS
        for _ in range(reps):
            prompt = [rng.randrange(vocab) for _ in range(depth)]
            res = post(base, "/completion", {"prompt": prompt, "n_predict": DECODE_TOKENS, "temperature": 0,
                                             "cache_prompt": False, "ignore_eos": True})
            t = res["timings"]
            if t["prompt_n"] != depth:
                sys.exit(f"server_speed: {base} prefilled {t['prompt_n']} of {depth} prompt tokens")
            best_pp, best_tg = max(best_pp, t["prompt_per_second"]), max(best_tg, t["predicted_per_second"])
            fewest = min(fewest, t["predicted_n"])
        figures[f"pp{depth}"] = best_pp
        figures[f"tg{DECODE_TOKENS}@{depth}"] = best_tg
        figures[f"decoded@{depth}"] = fewest
    return figures


def run_server(cmd, log_path, body):
    """Starts `cmd` on a free port, runs `body(base)` once it is healthy, and stops it."""
    port = free_port()
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd + ["--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=log)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(base, cmd[0], p)
            time.sleep(1)
            return body(base)
        finally:
            stop(p)


def table(name, rows, depths):
    """Markdown: each server's best round per figure and ours over llama-server's."""
    keys = [k for d in depths for k in (f"pp{d}", f"tg{DECODE_TOKENS}@{d}")]
    best = {srv: {k: max(r[k] for r in rows if r["server"] == srv) for k in keys} for srv in ("radix-serve", "llama-server")}
    lines = [f"| {name} | " + " | ".join(keys) + " |", "| --- |" + " ---: |" * len(keys)]
    for srv in best:
        lines.append(f"| {srv} tok/s | " + " | ".join(f"{best[srv][k]:.1f}" for k in keys) + " |")
    lines.append("| **ours / llama-server** | " + " | ".join(
        f"**{best['radix-serve'][k] / best['llama-server'][k]:.2f}**" for k in keys) + " |")
    for srv in best:
        short = sorted({r[f"decoded@{d}"] for r in rows if r["server"] == srv for d in depths} - {DECODE_TOKENS})
        if short:
            lines.append(f"\n{srv} ended some replies early (fewest tokens decoded: {short[0]}).")
    return "\n".join(lines) + "\n"


def main():
    model, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    threads, ctx = os.environ.get("THREADS", "2"), os.environ.get("CTX", "8192")
    reps, vocab = int(os.environ.get("REPS", "2")), int(os.environ.get("VOCAB", "100000"))
    depths = [int(d) for d in os.environ.get("DEPTHS", "512,2048").split(",")]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(0)
    rows = []
    for r in range(rounds):
        for srv, cmd in server_commands(model, threads, ctx).items():
            figures = run_server(cmd, f"{out}/speed-{name}-{srv}-{r}.log",
                                 lambda base: measure(base, depths, reps, vocab, rng))
            row = dict(model=name, server=srv, round=r, **figures)
            rows.append(row)
            print(json.dumps(row), flush=True)
    json.dump(rows, open(f"{out}/speed-{name}.json", "w"), indent=1)
    md = table(name, rows, depths)
    open(f"{out}/speed-{name}.md", "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
