#!/usr/bin/env bash
# Prefill and decode deep into a context, per K/V cache type, against llama.cpp's llama-bench on
# the same GGUF in one run (issue 34). Not a test.
#
#   benches/run-long-context.sh
#
# For each type in TYPES and each round: ours (`model-bench --pp PP --pp-depth DEPTHS --tg-ctx
# DEPTHS --kv-dtype T`), then llama-bench (`-p PP -n TG -d DEPTHS -fa 1 -ctk T -ctv T`). Both
# prefill the depth once, untimed, then time PP more prompt tokens (forwards of at most 512) and
# TG decode steps after it. The table takes each figure's best round.
#
# Environment: MODEL (qwen3np, a name of scripts/bench-model.sh), TYPES ("f16 q8_0"), DEPTHS
# (8192), PP (512), TG (32), REPS (1), ROUNDS (1), THREADS (2), OUT (target/long-context).
# RADIX_CPU_ISA caps both runtimes' instruction sets, as in run-model-bench.sh.
#
# A 2-core machine prefills a 32k depth of the Qwen3-0.6B shape in about 10 minutes per runtime
# and type (attention grows with the square of the depth); 128k takes about 16 times that.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${MODEL:-qwen3np}"
TYPES="${TYPES:-f16 q8_0}"
DEPTHS="${DEPTHS:-8192}"
PP="${PP:-512}"
TG="${TG:-32}"
REPS="${REPS:-1}"
ROUNDS="${ROUNDS:-1}"
THREADS="${THREADS:-2}"
OUT="${OUT:-target/long-context}"
mkdir -p "$OUT"
log() { echo "run-long-context: $*" >&2; }

log "building model-bench (release)"
cargo build --release -p radix-serve -p radix-benches --bin radix-serve --bin model-bench >&2
ours="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/model-bench"
llama_bin=$(nice -n 10 scripts/build-llama-cpp.sh)
cp "$llama_bin/build-flags.txt" "$OUT/llama-build-flags.txt"
model=$(scripts/bench-model.sh "$MODEL")

for t in $TYPES; do
  for r in $(seq 1 "$ROUNDS"); do
    log "$t round $r: ours"
    "$ours" --model "$model" --threads "$THREADS" --pp "$PP" --pp-depth "$DEPTHS" --tg-ctx "$DEPTHS" \
      --tg-tokens "$TG" --reps "$REPS" --kv-dtype "$t" --json >"$OUT/ours-$t-$r.json" 2>"$OUT/ours-$t-$r.log"
    log "$t round $r: llama.cpp"
    "$llama_bin/llama-bench" -m "$model" -t "$THREADS" -p "$PP" -n "$TG" -d "$DEPTHS" -b 2048 -ub 512 -fa 1 \
      -ctk "$t" -ctv "$t" -r "$REPS" -o json >"$OUT/llama-$t-$r.json" 2>"$OUT/llama-$t-$r.log"
  done
done

python3 - "$OUT" "$ROUNDS" "$model" $TYPES >"$OUT/table.md" <<'EOF'
import json, os, sys
out, rounds, model, types = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
o0 = json.load(open(f"{out}/ours-{types[0]}-1.json"))
print(f"{os.path.basename(model)}; ours: ISA {o0['isa']}, {o0['threads']} threads; llama.cpp: "
      f"{open(out + '/llama-build-flags.txt').read().strip()}, -fa 1; best of {rounds} round(s)\n")
print("| K/V | test | ours tok/s | llama.cpp tok/s | ours / llama.cpp |")
print("| --- | --- | ---: | ---: | ---: |")
for t in types:
    best_ours, best_llama = {}, {}
    for r in range(1, rounds + 1):
        for x in json.load(open(f"{out}/ours-{t}-{r}.json"))["results"]:
            key = (x["n_prompt"], x["n_gen"], x["depth"])
            best_ours[key] = max(best_ours.get(key, 0), x["tokens_per_s"])
        for x in json.load(open(f"{out}/llama-{t}-{r}.json")):
            key = (x["n_prompt"], x["n_gen"], x.get("n_depth", 0))
            best_llama[key] = max(best_llama.get(key, 0), x["avg_ts"])
    for key in sorted((k for k in best_ours if k[2] > 0), key=lambda k: (k[2], -k[0])):
        test = f"pp{key[0]} @ d{key[2]}" if key[0] else f"tg{key[1]} @ d{key[2]}"
        ours, llama = best_ours[key], best_llama.get(key)
        ratio = f"**{ours / llama:.2f}**" if llama else "n/a"
        print(f"| {t}/{t} | {test} | {ours:.1f} | {f'{llama:.1f}' if llama else 'n/a'} | {ratio} |")
EOF
cat "$OUT/table.md"
