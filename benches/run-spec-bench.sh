#!/usr/bin/env bash
# Speculative decoding's decode speed on agent edits, free-form answers and a tool-call turn:
# radix-serve with `--spec-type ngram` (each request with and without speculation) against
# llama-server with `--spec-type ngram-mod` and without, one server at a time, on the same GGUF
# (default: the real Qwen2.5-Coder-0.5B Q4_K_M). See benches/spec_bench.py. Not a test.
#
#   benches/run-spec-bench.sh [MODEL]    MODEL: a bench-model.sh name (default qwen-coder) or a .gguf
#
# Environment: THREADS=2, ROUNDS=2, EDIT_TOKENS=1024, FREE_TOKENS=300, WORKLOADS (space-separated
# names, default all), OUT=target/spec-bench (table in spec-bench.md, raw JSON, server logs),
# SPEC_TYPE=ngram (ours: ngram, draft-mtp or ngram,draft-mtp), LLAMA_SPEC_TYPE=ngram-mod.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-target/spec-bench}"
mkdir -p "$OUT"
model="${1:-qwen-coder}"
case "$model" in
  *.gguf) f="$model" ;;
  *) f=$(scripts/bench-model.sh "$model") ;;
esac
echo "run-spec-bench: building radix-serve (release)" >&2
cargo build --release -p radix-serve -p radix-benches --bin radix-serve >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
llama_bin=$(nice -n 10 scripts/build-llama-cpp.sh)
python3 benches/spec_bench.py "$target_dir/release/radix-serve" "$llama_bin/llama-server" "$f" "$OUT" | tee "$OUT/spec-bench.md"
