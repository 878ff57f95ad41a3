#!/usr/bin/env bash
# What a long stop list costs a reply, end to end: one radix-serve (release, SmolLM2) answers the
# same greedy chat request with no stop strings and with STOPS stop strings that never occur
# (the body a client probing us sent: 300,000 of them), alternating, REPS times each; prints the
# median wall time of each and their ratio, and checks both replies are the same text. Not a test.
#
#   benches/run-stop-bench.sh      settings from the environment: STOPS (300000), TOKENS (40),
#                                  REPS (5), THREADS (2)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "run-stop-bench: building radix-serve (release)" >&2
cargo build --release -p radix-serve -p radix-benches --bin radix-serve >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
model=$(scripts/assets.sh path smollm2)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$target_dir/release/radix-serve" -m "$model" --port "$port" -t "${THREADS:-2}" >/tmp/run-stop-bench.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT

python3 - "$port" <<'EOF'
import os, statistics, sys, time

sys.path.insert(0, "benches")
from bench_http import post, wait_healthy

port = int(sys.argv[1])
stops, tokens, reps = (int(os.environ.get(k, d)) for k, d in (("STOPS", 300000), ("TOKENS", 40), ("REPS", 5)))
base = f"http://127.0.0.1:{port}"
wait_healthy(base, "run-stop-bench: the server (see /tmp/run-stop-bench.log)")

def reply(stop_list):
    body = {"messages": [{"role": "user", "content": "Write a short story about a lighthouse keeper."}],
            "max_tokens": tokens, "temperature": 0, "cache_prompt": True}
    if stop_list:
        body["stop"] = stop_list
    started = time.perf_counter()
    answer = post(base, "/v1/chat/completions", body, timeout=600)
    return time.perf_counter() - started, answer["choices"][0]["message"]["content"], answer["usage"]

# A control character no reply contains starts every stop, so none matches.
many = [f"\u0001stop{i}" for i in range(stops)]
reply(None)  # warm: the prompt's prefix is cached for both arms alike
plain, stopped = [], []
for _ in range(reps):
    t, text_plain, usage = reply(None)
    plain.append(t)
    t, text_stopped, _ = reply(many)
    stopped.append(t)
    if text_plain != text_stopped:
        sys.exit(f"run-stop-bench: the replies differ:\n{text_plain!r}\n{text_stopped!r}")
a, b = statistics.median(plain), statistics.median(stopped)
print(f"| stops | reply tokens | median wall (s) | ratio |")
print(f"|---|---|---|---|")
print(f"| 0 | {usage['completion_tokens']} | {a:.3f} | 1.00 |")
print(f"| {stops:,} | {usage['completion_tokens']} | {b:.3f} | {b / a:.2f} |")
EOF
