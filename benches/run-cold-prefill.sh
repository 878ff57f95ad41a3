#!/usr/bin/env bash
# A cold prompt's prefill end to end: radix-serve and llama-server on the same GGUF, started one
# at a time (2 cores cannot host both fairly), each given REPS prompts of TOKENS token ids that no
# cache holds (`/completion`, `n_predict` 1, greedy), ROUNDS rounds alternating the servers. Prints,
# per server, the best round's median wall time and its median `timings.prompt_ms` (both servers
# report llama.cpp's `timings`), and the ratios. Not a test.
#
#   benches/run-cold-prefill.sh      settings from the environment: MODEL (qwen35, a name of
#                                    scripts/bench-model.sh), TOKENS (8192), REPS (2), ROUNDS (2),
#                                    THREADS (2), OUT (target/cold-prefill)
#
# Both servers prefill as they do by default: radix-serve in forwards of `--batch-tokens` 512,
# llama-server in ubatches of 512.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${MODEL:-qwen35}"
THREADS="${THREADS:-2}"
OUT="${OUT:-target/cold-prefill}"
mkdir -p "$OUT"
log() { echo "run-cold-prefill: $*" >&2; }

log "building radix-serve (release)"
cargo build --release -p radix-serve -p radix-benches --bin radix-serve >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
log "locating/building llama.cpp"
llama_bin=$(nice -n 10 scripts/build-llama-cpp.sh)
cp "$llama_bin/build-flags.txt" "$OUT/llama-build-flags.txt"
model=$(scripts/bench-model.sh "$MODEL")

ctx=$(( ${TOKENS:-8192} + 1024 ))
TARGET_DIR="$target_dir" LLAMA_BIN="$llama_bin" MODEL_FILE="$model" CTX="$ctx" THREADS="$THREADS" OUT="$OUT" \
  python3 - <<'EOF'
import os, statistics, subprocess, sys, time

sys.path.insert(0, "benches")
from bench_http import free_port, post, wait_healthy

tokens, reps, rounds = (int(os.environ.get(k, d)) for k, d in (("TOKENS", 8192), ("REPS", 2), ("ROUNDS", 2)))
threads, ctx, out = os.environ["THREADS"], os.environ["CTX"], os.environ["OUT"]
model = os.environ["MODEL_FILE"]
servers = {
    "radix-serve": [f"{os.environ['TARGET_DIR']}/release/radix-serve", "-m", model, "-t", threads,
                    "-c", ctx, "--parallel", "1"],
    "llama-server": [f"{os.environ['LLAMA_BIN']}/llama-server", "-m", model, "-t", threads,
                     "-c", ctx, "-np", "1"],
}

def run(name, round_no, first_id):
    port = free_port()
    log = open(f"{out}/{name}-{round_no}.log", "w")
    proc = subprocess.Popen(servers[name] + ["--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, f"run-cold-prefill: {name} (see {out}/{name}-{round_no}.log)", proc)
        vocab = 100000  # ids below every special token of the models bench-model.sh makes
        # Warm-up, as llama-bench warms up: a short prompt no later prompt starts with.
        post(base, "/completion", {"prompt": [(i * 31 + 7) % vocab for i in range(512)], "n_predict": 1,
                                   "temperature": 0, "cache_prompt": False})
        walls, prompt_ms = [], []
        for rep in range(reps):
            # A first token of its own per prompt: nothing is cached for it on either server.
            ids = [first_id + rep] + [(i * 7919 + rep) % vocab for i in range(1, tokens)]
            started = time.perf_counter()
            answer = post(base, "/completion", {"prompt": ids, "n_predict": 1, "temperature": 0,
                                                "cache_prompt": False})
            walls.append(time.perf_counter() - started)
            timings = answer["timings"]
            if timings["prompt_n"] != tokens:
                sys.exit(f"run-cold-prefill: {name} prefilled {timings['prompt_n']} of {tokens} tokens")
            prompt_ms.append(timings["prompt_ms"])
        return statistics.median(walls), statistics.median(prompt_ms)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()

best = {}
rows = []
for r in range(1, rounds + 1):
    for i, name in enumerate(servers):
        wall, ms = run(name, r, 100000 - 1000 * (2 * r + i))
        rows.append(f"| {r} | {name} | {wall:.2f} | {ms / 1000:.2f} | {tokens / (ms / 1000):.1f} |")
        print(rows[-1], file=sys.stderr)
        if name not in best or wall < best[name][0]:
            best[name] = (wall, ms)

lines = [f"{tokens}-token cold prompt, {threads} threads, {reps} prompts a round (medians), best of {rounds} rounds", "",
         "| round | server | wall s | prompt s (timings) | prompt tok/s |", "| --- | --- | ---: | ---: | ---: |", *rows, ""]
(ow, oms), (lw, lms) = best["radix-serve"], best["llama-server"]
lines.append(f"best rounds: radix-serve {ow:.2f} s wall ({tokens / (oms / 1000):.1f} tok/s prefill), "
             f"llama-server {lw:.2f} s ({tokens / (lms / 1000):.1f} tok/s); "
             f"llama-server / radix-serve: wall {lw / ow:.2f}x, prefill {lms / oms:.2f}x")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
