#!/usr/bin/env bash
# Builds, on this machine, what benches/gpu/check.sh runs on a lent GPU machine that has no
# network and cannot fetch crates: the CUDA build (sm_90, through ../shared/cuda-ci-setup.sh's
# compiler wheels), stripped and packed into .gpu/ (binaries, the tiny fixtures are in the tree)
# and SmolLM2 split into parts small enough for the device tool's 64 MiB per call:
#
#   .gpu/bin.tar.xz         radix-serve, device-bench, cache-bench, and the test binaries
#                           cuda_attention, model_parity, device_parity
#   .gpu/smollm2.part0      the first 43 MB of the SmolLM2 GGUF (carry .gpu in call 1)
#   .gpu-model/smollm2.part1  the rest                          (carry in call 2)
#   .gpu/smollm2.sha256     the whole file's sha256
#
# Both folders are git-ignored (.git/info/exclude). Never source cuda-ci-setup.sh on a machine
# with a real NVIDIA driver; there, build with the installed toolkit instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
setup="${CUDA_CI_SETUP:-../shared/cuda-ci-setup.sh}"
[ -f "$setup" ] || { echo "prepare.sh: $setup not found (set CUDA_CI_SETUP)" >&2; exit 1; }
# shellcheck disable=SC1090
. "$setup"
export CUDA_COMPUTE_CAP=90 CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/radix-serve/target-cuda}"

tests_json=$(cargo test --no-run --message-format=json -p radix-kernels -p radix-models \
  --features radix-kernels/cuda,radix-models/cuda --test cuda_attention --test model_parity --test device_parity)
cargo build -p radix-serve -p radix-benches --features radix-serve/cuda,radix-benches/cuda \
  --bin radix-serve --bin device-bench --bin cache-bench

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
echo "$tests_json" | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"])
' "$stage"
for b in radix-serve device-bench cache-bench; do cp "$CARGO_TARGET_DIR/debug/$b" "$stage/"; done
strip "$stage"/*
mkdir -p .gpu .gpu-model
# One large xz window: the binaries share candle's embedded kernels, which then compress once.
tar -cf - -C "$stage" . | xz -T2 -6 --lzma2=preset=6,dict=192MiB >.gpu/bin.tar.xz
model=$(scripts/assets.sh path smollm2)
sha256sum "$model" | cut -d' ' -f1 >.gpu/smollm2.sha256
# Call 1 carries the tree (~11.5 MB with the hybrid fixtures), the binaries (~12 MB) and part 0;
# call 2 the tree and part 1: each within the device tool's 64 MiB.
first=43000000
head -c "$first" "$model" >.gpu/smollm2.part0
tail -c +"$((first + 1))" "$model" >.gpu-model/smollm2.part1
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
grep -qx '/.gpu-model/' .git/info/exclude 2>/dev/null || echo '/.gpu-model/' >>.git/info/exclude
du -sh .gpu .gpu-model >&2
