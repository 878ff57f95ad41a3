#!/usr/bin/env bash
# cache-bench's `compare`: radix-serve and llama.cpp's llama-server on the same GGUF, every agent
# workload on each, in one run. Not a test.
#
#   benches/run-cache-bench.sh                 SmolLM2-135M, the `smollm2` preset
#   MODEL=qwen3 benches/run-cache-bench.sh     the Qwen3-0.6B-shaped model, full-size workloads
#   MODEL=qwen-coder benches/run-cache-bench.sh  Qwen2.5-Coder-0.5B-Instruct (the default model), full-size
#   MODEL=qwen35 benches/run-cache-bench.sh    the Qwen3.5-0.8B-shaped hybrid model, `smollm2` sizes
#
# Builds radix-serve and cache-bench (release), takes llama-server from scripts/build-llama-cpp.sh
# (built once, ~15-30 min, cached in ~/.cache/radix-serve/llama.cpp), the model from
# scripts/bench-model.sh. Each server gets a fresh process per workload, never two at once.
#
# Environment:
#   MODEL=smollm2 | qwen3 | qwen-coder | qwen35 | qwen35mininp
#   THREADS=2            threads of each server
#   WORKLOADS=...        default: single,split-system,interleaved,subagent,compaction; also
#                        subagent-branch and edited-system (branches inside the system block);
#                        `recorded` replays RECORDED=FILE (benches/record-opencode.sh makes one)
#   OUT=target/cache-bench/<model>   table.md, results.json, <workload>.svg, server logs
#   LLAMA_CONFIGS=...    llama-server configurations, `label=flags;...` (default: the preset's)
#   EXTRA=...            more cache-bench flags (e.g. --seed 2, --ctx 8192); split on spaces, so
#                        a value with spaces (--radix-args, --llama-configs) cannot go here; a
#                        flag given here overrides the preset's
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${MODEL:-smollm2}"
THREADS="${THREADS:-2}"
WORKLOADS="${WORKLOADS:-single,split-system,interleaved,subagent,compaction}"
OUT="${OUT:-target/cache-bench/$MODEL}"

log() { echo "run-cache-bench: $*" >&2; }

log "building radix-serve and cache-bench (release)"
cargo build --release -p radix-serve -p radix-benches --bin radix-serve --bin cache-bench >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')

log "locating/building llama.cpp"
llama_bin=$(nice -n 10 scripts/build-llama-cpp.sh)
log "peer: $(cat "$llama_bin/build-flags.txt")"
mkdir -p "$OUT" && cp "$llama_bin/build-flags.txt" "$OUT/llama-build-flags.txt"
model=$(scripts/bench-model.sh "$MODEL")

case "$MODEL" in
  # SmolLM2's own template ignores `tools` and the two servers would fall back differently; both
  # get a ChatML template that shows tools, so their prompts are the same text.
  smollm2) args=(--preset smollm2 --ctx 8192 --chat-template-file benches/templates/chatml_tools.jinja) ;;
  # The real Qwen3 template rides in the GGUF's metadata; both servers use it.
  # 4 GiB of f16 KV holds ~36k Qwen3-0.6B tokens, what llama-server's -c 32768 allocates.
  qwen3) args=(--preset full --ctx 32768 --radix-args "--parallel 4 --kv-cache 4096") ;;
  # The server's default model; its own template (Qwen's tool format) rides in the GGUF.
  # 1.5 GiB of f16 KV holds 4 x 32k tokens of it (12 KiB a token).
  qwen-coder) args=(--preset full --ctx 32768 --radix-args "--parallel 4 --kv-cache 1536") ;;
  # Hybrid (Gated DeltaNet + attention): a cached prefix is reusable only where the recurrent
  # state was saved (our snapshots, llama-server's context checkpoints). Random weights, the real
  # Qwen3.5 tokenizer and template (from the GGUF; both servers use it). The small workload sizes
  # because the 0.8B shape is slow on 2 cores; prompts stay under ~7k tokens, so -c 16384 is room
  # to spare. Only 6 of its 24 layers have KV (12 KiB a token: 6 x 2 heads x 256 x K,V x 2 bytes):
  # 768 MiB is 4 x 16k tokens of it. llama-server keeps its defaults; -lv 4 logs its checkpoint
  # events (created, restored, erased, full re-processing), which cache-bench counts.
  qwen35)
    args=(--preset smollm2 --ctx 16384 --radix-args "--parallel 4 --kv-cache 768")
    llama_configs="llama-server=-lv 4;llama-server -np 1=-np 1 -sps 0 -lv 4"
    ;;
  # Qwen3.5's structure in 4 small layers: the 0.8B shape's prefilled tokens (they depend on the
  # tokens and the slot counts, not the weights) at a fraction of its time. 64 MiB of KV and 16
  # of state are the 0.8B shape's 65,536 KV tokens and 39 snapshot slots; TTFTs are not the 0.8B's.
  qwen35mininp)
    args=(--preset smollm2 --ctx 16384 --radix-args "--parallel 4 --kv-cache 64 --state-cache 16")
    llama_configs="llama-server=-lv 4"
    ;;
  *) log "unknown MODEL $MODEL"; exit 2 ;;
esac
llama_configs="${LLAMA_CONFIGS:-${llama_configs:-}}"
if [ -n "$llama_configs" ]; then args+=(--llama-configs "$llama_configs"); fi
if [ -n "${RECORDED:-}" ]; then args+=(--recorded "$RECORDED"); fi

# shellcheck disable=SC2086
exec "$target_dir/release/cache-bench" compare --model "$model" --radix-serve "$target_dir/release/radix-serve" \
  --llama-server "$llama_bin/llama-server" --threads "$THREADS" --workloads "$WORKLOADS" --out "$OUT" \
  "${args[@]}" ${EXTRA:-}
