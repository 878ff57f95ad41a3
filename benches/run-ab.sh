#!/usr/bin/env bash
# Our runtime at two commits, in one run: model-bench's prefill and decode speeds and the
# cache-bench agent replay, base and head alternating round by round, so a refactor's cost (or
# gain) is a same-run ratio and not a comparison across sessions. Not a test.
#
#   benches/run-ab.sh                 base = BASE (default 4fb5aed, the commit before issue 14),
#                                     head = the working tree
#
# Environment:
#   BASE=4fb5aed   the commit to compare against (checked out once, detached, in ~/.cache/radix-serve/ab/)
#   THREADS=2      threads of every run
#   REPS=3         repetitions of each model-bench figure (its median)
#   ROUNDS=3       base and head alternate this many times; the best round of each counts
#   MODEL=smollm2  the model both load (scripts/bench-model.sh NAME)
#   CACHE=1        also replay cache-bench's workloads (0: model-bench only)
#   WORKLOADS=single,split-system,interleaved,subagent,compaction
#   OUT=target/ab  raw JSON, logs, and table.md
#   CACHE_DIR=0    1: each cache-bench server gets a fresh --cache-dir (the disk tier's write-through
#                  on the path measured; the directory is removed after the replay)
#
# Each tree builds into a release target directory of its own (~/.cache/radix-serve/target-ab-base
# and -head): cargo hashes a workspace crate by its path relative to the workspace root, so two
# checkouts sharing one directory overwrite each other's crates. The head's directory starts as a
# copy of the base's, so the dependencies are compiled once.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE="${BASE:-4fb5aed}"
THREADS="${THREADS:-2}"
REPS="${REPS:-3}"
ROUNDS="${ROUNDS:-3}"
MODEL="${MODEL:-smollm2}"
CACHE="${CACHE:-1}"
WORKLOADS="${WORKLOADS:-single,split-system,interleaved,subagent,compaction}"
OUT="${OUT:-target/ab}"
target_root="${AB_TARGET_DIR:-$HOME/.cache/radix-serve/target-ab}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

log() { echo "run-ab: $*" >&2; }

base_rev=$(git rev-parse --short "$BASE")
base_tree="$HOME/.cache/radix-serve/ab/$base_rev"
if [ ! -d "$base_tree" ]; then
  log "checking out $base_rev into $base_tree"
  git worktree add --detach "$base_tree" "$base_rev" >&2
fi

# Builds model-bench, radix-serve and cache-bench of one tree and copies them to $OUT/bin-NAME.
# The executables are taken from cargo's own report (the hashed files under release/deps), not
# from release/, which both trees write the same names into.
build() {
  local name=$1 tree=$2
  log "building $name ($tree, release)"
  mkdir -p "$OUT/bin-$name"
  if [ "$name" = head ] && [ ! -d "$target_root-head" ] && [ -d "$target_root-base" ]; then
    cp -a "$target_root-base" "$target_root-head"
    # Only the dependencies: the base's own crates would look fresh to cargo (it compares
    # modification times, and the base was built after the head's sources last changed).
    rm -rf "$target_root-head"/release/.fingerprint/radix-* "$target_root-head"/release/build/radix-* \
      "$target_root-head"/release/deps/{libradix_,radix_,radix-}*
  fi
  (cd "$tree" && CARGO_TARGET_DIR="$target_root-$name" cargo build --release --locked -p radix-serve -p radix-benches \
    --bin radix-serve --bin model-bench --bin cache-bench --message-format=json-render-diagnostics) |
    python3 -c '
import json, shutil, sys
out = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    name = m.get("target", {}).get("name")
    if m.get("reason") == "compiler-artifact" and m.get("executable") and name in ("radix-serve", "model-bench", "cache-bench"):
        shutil.copy(m["executable"], out + "/" + name)
' "$OUT/bin-$name"
  for b in radix-serve model-bench cache-bench; do
    [ -x "$OUT/bin-$name/$b" ] || { log "no $b built for $name"; exit 1; }
  done
}
build base "$base_tree"
build head "$PWD"

model=$(scripts/bench-model.sh "$MODEL")
case "$MODEL" in
  smollm2) cache_args=(--preset smollm2) serve_args=(--ctx-size 8192 --chat-template-file benches/templates/chatml_tools.jinja) ;;
  *) cache_args=(--preset full) serve_args=(--ctx-size 32768 --kv-cache 4096) ;;
esac

# One cache-bench replay against a fresh server of one build.
replay() {
  local name=$1 round=$2 port=$3
  local disk=()
  if [ "${CACHE_DIR:-0}" = 1 ]; then
    rm -rf "$OUT/disk-$name-$round"
    disk=(--cache-dir "$OUT/disk-$name-$round")
  fi
  "$OUT/bin-$name/radix-serve" -m "$model" --port "$port" --threads "$THREADS" --parallel 4 --kv-cache 1024 \
    "${serve_args[@]}" "${disk[@]}" >"$OUT/serve-$name-$round.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.5
  done
  "$OUT/bin-$name/cache-bench" run --base-url "http://127.0.0.1:$port/v1" --label "$name" \
    --workloads "$WORKLOADS" "${cache_args[@]}" --out "$OUT/cache-$name-$round" >"$OUT/cache-$name-$round.log" 2>&1 || true
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$OUT/disk-$name-$round"
}

for r in $(seq 1 "$ROUNDS"); do
  for name in base head; do
    log "round $r: model-bench $name"
    "$OUT/bin-$name/model-bench" --model "$model" --threads "$THREADS" --pp 512,2048 --tg-ctx 512,2048 \
      --tg-tokens 32 --reps "$REPS" --kv-budget-mib 256 --touch-kv --json \
      >"$OUT/model-$name-$r.json" 2>"$OUT/model-$name-$r.log"
    if [ "$CACHE" = 1 ]; then
      log "round $r: cache-bench $name"
      replay "$name" "$r" 18731
    fi
  done
done

python3 - "$OUT" "$ROUNDS" "$base_rev" "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty)" "$CACHE" >"$OUT/table.md" <<'EOF'
import json, sys, os
out, rounds, base_rev, head_rev, cache = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
print(f"base {base_rev}, head {head_rev}; best of {rounds} alternating round(s)\n")
def figures(name):
    best = {}
    for r in range(1, rounds + 1):
        d = json.load(open(f"{out}/model-{name}-{r}.json"))
        for key, value in flatten(d):
            best[key] = max(best.get(key, 0.0), value)
    return best
def flatten(d):
    for r in d["results"]:
        yield r["test"], r["tokens_per_s"]
b, h = figures("base"), figures("head")
print("| model-bench | base tok/s | head tok/s | head / base |")
print("| --- | ---: | ---: | ---: |")
for key in b:
    print(f"| {key} | {b[key]:.1f} | {h.get(key, 0):.1f} | {h.get(key, 0) / b[key]:.3f} |")
if cache:
    print("\n| workload | base wall s | head wall s | base / head | base warm TTFT p50 ms | head warm TTFT p50 ms | cached tokens base / head | errors base / head |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    def runs(name):
        best = {}
        for r in range(1, rounds + 1):
            path = f"{out}/cache-{name}-{r}/results.json"
            if not os.path.exists(path):
                continue
            for w in json.load(open(path))["summaries"]:
                if w["workload"] not in best or w["wall_s"] < best[w["workload"]]["wall_s"]:
                    best[w["workload"]] = w
        return best
    rb, rh = runs("base"), runs("head")
    for key, wb in rb.items():
        wh = rh.get(key)
        if wh is None:
            print(f"| {key} | {wb['wall_s']:.1f} | - | - | | | | |")
            continue
        print(f"| {key} | {wb['wall_s']:.1f} | {wh['wall_s']:.1f} | {wb['wall_s'] / wh['wall_s']:.3f} | "
              f"{wb['ttft_warm_ms'][0]:.0f} | {wh['ttft_warm_ms'][0]:.0f} | {wb['cached_tokens']} / {wh['cached_tokens']} | "
              f"{wb['errors']} / {wh['errors']} |")
EOF
cat "$OUT/table.md"
