#!/usr/bin/env bash
# The GPU check, run on a lent NVIDIA machine from the repository root, with what
# benches/gpu/prepare.sh packed here carried along (that machine has no network):
#
#   benches/gpu/check.sh kernels   unpack; CUDA kernels vs CPU kernels; tiny models on CUDA vs
#                                  transformers; device-bench timings (Qwen3-0.6B and -8B shapes,
#                                  bf16 and Q4_K, batch 1/8/32, context 2k/8k, floor %)
#   benches/gpu/check.sh model     SmolLM2 (its parts joined): CUDA vs CPU path (greedy, logits,
#                                  mixed batch over cached prefixes); cache-bench agent replay
#                                  against radix-serve --device cuda
#   benches/gpu/check.sh all       both (when the whole model fits in one call)
#
# Everything goes to $OUT (the device tool's output folder) or target/gpu-check: check.log,
# device-bench.md/.json, cache-bench/. Unpacked files live in /tmp/radix, which survives between
# calls while the machine stays warm. Each step has a time limit, so one stuck step cannot eat
# the session's device time.
set -uo pipefail
cd "$(dirname "$0")/../.."
phase="${1:-all}"
OUT="${OUT:-target/gpu-check}"
mkdir -p "$OUT" /tmp/radix/bin /tmp/radix/assets/smollm2
log() { echo "== $(date +%T) $*" | tee -a "$OUT/check.log"; }
step() { # step SECONDS NAME COMMAND...
  local limit=$1 name=$2; shift 2
  log "$name"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/check.log"
  local rc=${PIPESTATUS[0]}
  log "$name: exit $rc"
  return 0
}

# The binaries name the checkout they were built from (/work/main) for fixtures and scripts.
if [ ! -e /work/main/scripts/assets.sh ]; then mkdir -p /work && ln -sfn "$PWD" /work/main; fi
export RADIX_ASSETS=/tmp/radix/assets RADIX_TEST_DEVICE=cuda:0 CUDA_COMPUTE_CAP=90
# candle loads cuBLAS and friends at run time; the image's PyTorch wheels carry CUDA 13's.
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13/lib") for p in nvidia.__path__))' 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
bin=/tmp/radix/bin

if [ -f .gpu/bin.tar.xz ] && [ ! -x "$bin/radix-serve" ]; then
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' .gpu/bin.tar.xz "$bin"
fi
for part in .gpu/smollm2.part0 .gpu-model/smollm2.part1; do [ -f "$part" ] && cp "$part" /tmp/radix/; done
[ -f .gpu/smollm2.sha256 ] && cp .gpu/smollm2.sha256 /tmp/radix/

if [ "$phase" = kernels ] || [ "$phase" = all ]; then
  : >"$OUT/check.log" # a fresh log, so device-bench.md below holds this run's tables only
  log "machine"; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee -a "$OUT/check.log"
  ldd "$bin/radix-serve" | grep -i 'not found' | tee -a "$OUT/check.log"
  step 90 "CUDA kernels vs CPU kernels" "$bin/cuda_attention" --nocapture --test-threads=1
  step 120 "tiny models: CPU path, CPU tensor path and CUDA vs transformers" "$bin/model_parity" --nocapture --test-threads=1
  # 8B first: its batch-1 decode against the bandwidth floor is the figure that matters most.
  step 300 "device-bench" "$bin/device-bench" --device cuda:0 --shapes qwen3-8b,qwen3-0.6b --decode-steps 6 \
    --max-prefill-pairs 67108864 --json "$OUT/device-bench.json"
  # The only tables this phase prints are device-bench's.
  grep '^|' "$OUT/check.log" >"$OUT/device-bench.md" || true
fi

if [ "$phase" = model ] || [ "$phase" = all ]; then
  model=/tmp/radix/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f "$model" ] && [ -f /tmp/radix/smollm2.part0 ] && [ -f /tmp/radix/smollm2.part1 ]; then
    cat /tmp/radix/smollm2.part0 /tmp/radix/smollm2.part1 >"$model"
  fi
  want=$(cat /tmp/radix/smollm2.sha256 2>/dev/null)
  if [ -z "$want" ] || [ "$(sha256sum "$model" 2>/dev/null | cut -d' ' -f1)" != "$want" ]; then
    log "SmolLM2 is missing or incomplete: carry .gpu (part 0) and .gpu-model (part 1)"; exit 1
  fi
  # assets.sh accepts a file whose stamp names the pinned archive hash.
  grep '^smollm2|' scripts/assets.sh | cut -d'|' -f4 >/tmp/radix/assets/smollm2.sha256
  step 180 "SmolLM2: CUDA vs CPU path" "$bin/device_parity" --nocapture --test-threads=1
  port=18080
  "$bin/radix-serve" -m "$model" --device cuda:0 --port $port -c 8192 --kv-cache 2048 --page-size 16 \
    --chat-template-file benches/templates/chatml_tools.jinja >"$OUT/radix-serve.log" 2>&1 &
  server=$!
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
  step 180 "cache-bench agent replay (SmolLM2 on cuda:0)" "$bin/cache-bench" run --base-url "http://127.0.0.1:$port/v1" \
    --preset smollm2 --workloads single --out "$OUT/cache-bench" --label radix-serve-cuda
  kill $server 2>/dev/null; wait $server 2>/dev/null
  tail -5 "$OUT/radix-serve.log" | tee -a "$OUT/check.log"
fi
log "done"
