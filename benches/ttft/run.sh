#!/usr/bin/env bash
# TTFT of agent-shaped conversations (cold turn, warm turns, interleaved sessions): radix-serve
# against llama.cpp's llama-server on the same GGUF, in one run. Not a test.
#
#   benches/ttft/run.sh
#
# Builds radix-serve (release), takes llama-server from scripts/build-llama-cpp.sh (builds it the
# first time, ~20 min), fetches SmolLM2-135M-Instruct through scripts/assets.sh, then runs
# benches/ttft/ttft_bench.py: each server in turn, a fresh process per scenario, never both at once.
#
# Environment:
#   THREADS=2          threads for both servers
#   ROUNDS=1           repeat everything (servers alternate); the ratio table takes the median
#   MODEL=<gguf>       default: scripts/assets.sh path smollm2
#   OUT=target/ttft-bench   records.json, table.md and the server logs
#   WAIT_FOR=llama-bench    pgrep -f pattern: wait while such a process runs (shared machine);
#                           empty to not wait
set -euo pipefail
cd "$(dirname "$0")/../.."

THREADS="${THREADS:-2}"
OUT="${OUT:-target/ttft-bench}"
ROUNDS="${ROUNDS:-1}"
WAIT_FOR="${WAIT_FOR-llama-bench}"

log() { echo "ttft: $*" >&2; }

log "building radix-serve (release)"
cargo build --release -p radix-serve >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
radix="$target_dir/release/radix-serve"

log "locating/building llama.cpp"
llama_bin=$(nice -n 10 scripts/build-llama-cpp.sh)

model="${MODEL:-$(scripts/assets.sh path smollm2)}"

exec python3 benches/ttft/ttft_bench.py --model "$model" --radix-serve "$radix" \
  --llama-server "$llama_bin/llama-server" --threads "$THREADS" --ctx 8192 --out "$OUT" \
  --wait-for "$WAIT_FOR" --rounds "$ROUNDS"
