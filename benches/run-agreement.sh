#!/usr/bin/env bash
# Greedy agreement of our runtime with llama.cpp on one GGUF: radix-serve and llama-server side
# by side, 5 prompts (the same token ids sent to both), 32 greedy steps each. Reports, per
# prompt, how many leading tokens agree and the teacher-forced top-1 agreement (our argmax
# after llama.cpp's own greedy prefix, step by step), which stays meaningful when random
# weights make logits so flat that one near tie sends the two free-running continuations apart.
# Not a test.
#
#   benches/run-agreement.sh [MODEL]     MODEL: a bench-model.sh name (default qwen35) or a .gguf
#
# Environment: THREADS=2, STEPS=32, OUT=target/agreement (agreement.md, raw JSON, server logs).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-2}"
STEPS="${STEPS:-32}"
OUT="${OUT:-target/agreement}"
mkdir -p "$OUT"
log() { echo "run-agreement: $*" >&2; }

model="${1:-qwen35}"
case "$model" in
  *.gguf) f="$model" ;;
  *) f=$(scripts/bench-model.sh "$model") ;;
esac
log "building radix-serve (release)"
cargo build --release -p radix-serve -p radix-benches --bin radix-serve >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
llama_bin=$(nice -n 10 scripts/build-llama-cpp.sh)

ours_port=18481
llama_port=18482
"$target_dir/release/radix-serve" -m "$f" --threads "$THREADS" --port "$ours_port" -c 4096 -np 1 \
  >"$OUT/radix-serve.log" 2>&1 &
ours=$!
"$llama_bin/llama-server" -m "$f" -t "$THREADS" --port "$llama_port" -c 4096 -np 1 \
  >"$OUT/llama-server.log" 2>&1 &
llama=$!
trap 'kill $ours $llama 2>/dev/null || true' EXIT
for port in $ours_port $llama_port; do
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
done

python3 - "$ours_port" "$llama_port" "$STEPS" "$OUT" "$f" <<'EOF' | tee "$OUT/agreement.md"
import json, sys
sys.path.insert(0, "benches")
import bench_http
ours, llama, steps, out, model = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

def post(port, path, body):
    return bench_http.post(f"http://127.0.0.1:{port}", path, body, timeout=600)

def greedy(port, ids, n):
    body = {"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1, "cache_prompt": False,
            "return_tokens": True, "stop": [], "ignore_eos": True}
    return post(port, "/completion", body)["tokens"][:n]

prompts = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three laws of thermodynamics are",
    "<|im_start|>user\nList the files in the current directory.<|im_end|>\n<|im_start|>assistant\n",
    "東京は日本の首都であり、",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
]
rows, raw = [], []
for text in prompts:
    ids = post(ours, "/tokenize", {"content": text})["tokens"]
    theirs = greedy(llama, ids, steps)
    mine = greedy(ours, ids, steps)
    prefix = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
    # A stop token ends our reply without a token in `tokens`: that step disagrees.
    forced = sum((greedy(ours, ids + theirs[:i], 1) or [None])[0] == theirs[i] for i in range(len(theirs)))
    rows.append((text, len(ids), prefix, forced, len(theirs)))
    raw.append({"prompt": text, "ids": ids, "llama": theirs, "ours": mine})
json.dump(raw, open(f"{out}/agreement.json", "w"), indent=1)
print(f"model {model}: {steps} greedy steps, the same prompt ids to both\n")
print("| prompt | prompt tokens | identical leading tokens | teacher-forced top-1 agreement |")
print("| --- | ---: | ---: | ---: |")
for text, n, prefix, forced, total in rows:
    shown = text.replace("\n", "\\n").replace("|", "\\|")[:40]
    print(f"| `{shown}` | {n} | {prefix}/{total} | {forced}/{total} |")
EOF
