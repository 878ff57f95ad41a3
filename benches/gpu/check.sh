#!/usr/bin/env bash
# The GPU check, run on a lent NVIDIA machine from the repository root, with what
# benches/gpu/prepare.sh packed carried along (that machine has no network). Two calls of the
# device tool, back to back while the machine is warm (/tmp/radix survives between them):
#
#   run: benches/gpu/check.sh kernels   carry [.gpu]        timeout_s 480   (~6 min)
#     unpack; CUDA kernels vs their CPU models (attention, Gated DeltaNet, MoE routing and
#     dispatch); the tiny dense/hybrid/MoE models on CUDA vs transformers and the CPU path; the
#     state pool in GPU memory vs the CPU path; the Qwen3.5-0.8B shape (checkpoint written there)
#     greedy on CUDA vs CPU; device-bench (Qwen3-0.6B/8B, Qwen3.5-0.8B, Qwen3-30B-A3B shapes,
#     bf16 and Q4_K, batch 1/8/32, context 2k/8k, decode vs the bandwidth floor; the 8B shape
#     over f16, q8_0 and q4_0 K/V at 8k and 32k; 30B-A3B with its experts on the CPU too, as
#     --cpu-moe)
#   run: benches/gpu/check.sh model     carry [.gpu-model]  timeout_s 300   (~3 min)
#     SmolLM2 (its two parts joined): CUDA vs CPU path (greedy 32 tokens on 4 prompts, logits,
#     mixed batch over cached prefixes); the cache-bench agent replay against radix-serve
#     --device cuda:0 and against --device cpu on the same machine, reuse compared
#   benches/gpu/check.sh all            both, when one call can carry both parts
#   benches/gpu/check.sh --dry-run PHASE   here, without a GPU: checks the packed files hold
#     every binary and part a phase uses and prints each step with its time limit
#
# Everything goes to $OUT (the device tool's output folder; at most 8 files come back) or
# target/gpu-check: check.log (every step's output), summary.md (one line per step: exit
# status and seconds), device-bench.md/.json, qwen35-shape.log, cache-bench.tar.gz. Each step has
# a time limit and a failing step does not stop the rest, so one stuck step cannot eat the
# session's device time and one rerun fits in what is left.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
dry=0
if [ "${1:-}" = --dry-run ]; then dry=1; shift; fi
phase="${1:-all}"
case "$phase" in
  kernels | model | all) ;;
  *) echo "usage: benches/gpu/check.sh [--dry-run] kernels|model|all" >&2; exit 2 ;;
esac
OUT="${OUT:-target/gpu-check}"
mkdir -p "$OUT"
log() { echo "== $(date +%T) $*" | tee -a "$OUT/check.log"; }
bin=/tmp/radix/bin
packed=()
if [ -f .gpu/bin.tar.xz ]; then mapfile -t packed < <(tar -tJf .gpu/bin.tar.xz | sed 's|^\./||' | grep -v '^$'); fi

step() { # step SECONDS NAME COMMAND...
  local limit=$1 name=$2 start rc
  shift 2
  if [ "$dry" = 1 ]; then
    local exe=${1##*/} where=ok
    if [[ $1 == "$bin"/* ]] && ! printf '%s\n' "${packed[@]}" | grep -qx "$exe"; then where="MISSING from .gpu/bin.tar.xz"; fi
    log "dry run: $name (limit ${limit} s): $* [$where]"
    echo "| $name | dry run: $where | | |" >>"$OUT/summary.md"
    return 0
  fi
  log "$name"
  start=$(date +%s)
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/check.log"
  rc=${PIPESTATUS[0]}
  log "$name: exit $rc"
  echo "| $name | $([ "$rc" = 0 ] && echo pass || echo "FAIL (exit $rc$([ "$rc" = 124 ] && echo ', timed out'))") | $(($(date +%s) - start)) s | $limit s |" >>"$OUT/summary.md"
  return 0
}

: >"$OUT/check.log"
printf '| step | result | took | limit |\n|---|---|--:|--:|\n' >"$OUT/summary.md"

if [ "$dry" = 0 ]; then
  mkdir -p "$bin" /tmp/radix/assets/smollm2
  # The binaries name the checkout they were built from (/work/main) for fixtures and scripts.
  if [ ! -e /work/main/scripts/assets.sh ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
  # candle loads cuBLAS and friends at run time; the image's PyTorch wheels carry CUDA 13's.
  for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13/lib") for p in nvidia.__path__))' 2>/dev/null); do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  if [ -f .gpu/bin.tar.xz ] && [ ! -x "$bin/radix-serve" ]; then
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' .gpu/bin.tar.xz "$bin"
  fi
  for part in .gpu/smollm2.part0 .gpu-model/smollm2.part1 .gpu/smollm2.sha256; do [ -f "$part" ] && cp "$part" /tmp/radix/; done
  log "machine"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee -a "$OUT/check.log"
  [ -x "$bin/radix-serve" ] || log "no binaries in $bin: carry .gpu (benches/gpu/prepare.sh packs it)"
  ldd "$bin/radix-serve" 2>&1 | grep -i 'not found' | tee -a "$OUT/check.log"
else
  log "dry run of phase $phase: nothing runs; .gpu/bin.tar.xz holds ${#packed[@]} files"
fi
export RADIX_ASSETS=/tmp/radix/assets RADIX_TEST_DEVICE=cuda:0 CUDA_COMPUTE_CAP=90

if [ "$phase" = kernels ] || [ "$phase" = all ]; then
  step 60 "CUDA kernels vs their CPU models: Gated DeltaNet, MoE routing and dispatch" \
    "$bin/cuda_delta_net" --nocapture --test-threads=1
  step 90 "CUDA attention vs the CPU kernels" "$bin/cuda_attention" --nocapture --test-threads=1
  step 60 "state pool in GPU memory (tiny hybrid and hybrid MoE) vs the CPU path" \
    "$bin/state_pool_devices" --nocapture --test-threads=1
  step 150 "tiny dense/hybrid/MoE models: CPU path, CPU tensor path and CUDA vs transformers" \
    "$bin/model_parity" --nocapture --test-threads=1
  # 1.6 GB of seeded random bf16 weights, written with the image's torch: too large to carry.
  qwen=/tmp/radix/qwen35-0.8b
  if [ "$dry" = 0 ] && [ ! -f "$qwen/model.safetensors" ]; then
    mkdir -p "$qwen/tokenizer" && echo '{}' >"$qwen/tokenizer/tokenizer.json" && echo '{}' >"$qwen/tokenizer/tokenizer_config.json"
  fi
  step 120 "Qwen3.5-0.8B-shaped checkpoint (seed 0)" python3 -c '
import sys; from pathlib import Path
sys.path.insert(0, "scripts")
from gen_qwen35_shaped import QWEN35_08B, write_checkpoint
d = Path(sys.argv[1])
if not (d / "model.safetensors").exists():
    write_checkpoint(d, QWEN35_08B, 0, d / "tokenizer")
' "$qwen"
  export RADIX_QWEN35_SHAPED=$qwen
  step 180 "Qwen3.5-0.8B shape: greedy 32 tokens on 4 prompts, CUDA vs CPU" \
    "$bin/qwen35_shape_parity" --nocapture --test-threads=1
  [ "$dry" = 0 ] && grep -E 'prompt [0-9]|free-running' "$OUT/check.log" >"$OUT/qwen35-shape.log"
  # 8B first: its batch-1 decode against the bandwidth floor is the figure that matters most.
  step 240 "device-bench: dense and hybrid shapes" "$bin/device-bench" --device cuda:0 \
    --shapes qwen3-8b,qwen3-0.6b,qwen3.5-0.8b --decode-steps 6 --max-prefill-pairs 67108864 \
    --json "$OUT/device-bench.json"
  # Issue 34: our kernels over q8_0/q4_0 pages against f16 at depth; the 8B shape's KV at 32k x 8
  # is 38 GB in f16.
  step 120 "device-bench: Qwen3-8B shape, Q4_K, K/V f16 vs q8_0 vs q4_0 at 8k and 32k" "$bin/device-bench" \
    --device cuda:0 --shapes qwen3-8b --formats q4k --kv f16,q8_0,q4_0 --batches 1,8 --contexts 8192,32768 \
    --decode-steps 6 --max-prefill-pairs 67108864 --json "$OUT/device-bench-kv.json"
  step 150 "device-bench: Qwen3-30B-A3B shape, Q4_K, experts on the GPU" "$bin/device-bench" --device cuda:0 \
    --shapes qwen3-30b-a3b --formats q4k --decode-steps 6 --max-prefill-pairs 16777216 \
    --json "$OUT/device-bench-moe.json"
  step 120 "device-bench: Qwen3-30B-A3B shape, Q4_K, experts on the CPU (--cpu-moe)" "$bin/device-bench" \
    --device cuda:0 --shapes qwen3-30b-a3b --formats q4k --batches 1,8 --contexts 2048 --decode-steps 4 \
    --max-prefill-pairs 0 --threads 16 --cpu-moe-layers 48
  # The only tables this phase prints are device-bench's.
  [ "$dry" = 0 ] && { grep '^|' "$OUT/check.log" >"$OUT/device-bench.md" || true; }
fi

if [ "$phase" = model ] || [ "$phase" = all ]; then
  model=/tmp/radix/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ "$dry" = 0 ]; then
    if [ ! -f "$model" ] && [ -f /tmp/radix/smollm2.part0 ] && [ -f /tmp/radix/smollm2.part1 ]; then
      cat /tmp/radix/smollm2.part0 /tmp/radix/smollm2.part1 >"$model"
    fi
    want=$(cat /tmp/radix/smollm2.sha256 2>/dev/null)
    if [ -z "$want" ] || [ "$(sha256sum "$model" 2>/dev/null | cut -d' ' -f1)" != "$want" ]; then
      log "SmolLM2 is missing or incomplete: carry .gpu (part 0) in call 1 and .gpu-model (part 1) in call 2"
      exit 1
    fi
    # assets.sh accepts a file whose stamp names the pinned archive hash.
    grep '^smollm2|' scripts/assets.sh | cut -d'|' -f4 >/tmp/radix/assets/smollm2.sha256
  else
    for f in .gpu/smollm2.part0 .gpu-model/smollm2.part1 .gpu/smollm2.sha256; do
      if [ -f "$f" ]; then log "dry run: $f present"; else log "dry run: $f MISSING (benches/gpu/prepare.sh makes it)"; fi
    done
  fi
  step 180 "SmolLM2: CUDA vs CPU path (greedy 32 tokens on 4 prompts, logits, mixed batch)" \
    "$bin/device_parity" --nocapture --test-threads=1
  replay() { # replay DEVICE PORT: the agent replay against radix-serve on DEVICE
    local device=$1 port=$2 server
    [ "$dry" = 1 ] && { log "dry run: radix-serve --device $device + cache-bench --preset smollm2 --workloads single"; return 0; }
    "$bin/radix-serve" -m "$model" --device "$device" --port "$port" -c 8192 --kv-cache 2048 --page-size 16 \
      --chat-template-file benches/templates/chatml_tools.jinja >"/tmp/radix/serve-$device.log" 2>&1 &
    server=$!
    for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
    step 150 "cache-bench agent replay (SmolLM2 on $device)" "$bin/cache-bench" run \
      --base-url "http://127.0.0.1:$port/v1" --preset smollm2 --workloads single \
      --out "/tmp/radix/cache-bench-$device" --label "radix-serve-$device"
    kill "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    tail -5 "/tmp/radix/serve-$device.log" | tee -a "$OUT/check.log"
  }
  replay cuda:0 18080
  replay cpu 18081
  if [ "$dry" = 0 ]; then
    # Reuse on the GPU must equal the CPU's: the same tokens cached and prefilled.
    for d in cuda:0 cpu; do
      log "cache-bench on $d:"
      grep -h '| single |' "/tmp/radix/cache-bench-$d"/*.md 2>/dev/null | head -1 | tee -a "$OUT/check.log"
    done
    a=$(grep -h '| single |' /tmp/radix/cache-bench-cuda:0/*.md 2>/dev/null | head -1 | cut -d'|' -f6-8)
    b=$(grep -h '| single |' /tmp/radix/cache-bench-cpu/*.md 2>/dev/null | head -1 | cut -d'|' -f6-8)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then verdict="equal ($a)"; else verdict="DIFFERENT (cuda:0 '$a', cpu '$b')"; fi
    log "reuse (prompt | cached | prefilled tokens), CUDA vs CPU: $verdict"
    echo "| replay reuse, CUDA vs CPU | $verdict | | |" >>"$OUT/summary.md"
    tar -czf "$OUT/cache-bench.tar.gz" -C /tmp/radix cache-bench-cuda:0 cache-bench-cpu serve-cuda:0.log serve-cpu.log 2>/dev/null
  fi
fi
log "done"
