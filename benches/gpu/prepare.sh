#!/usr/bin/env bash
# Builds, on a machine without a GPU, what benches/gpu/check.sh runs on a lent GPU machine that
# has no network and cannot fetch crates: the CUDA build (sm_90, with ../shared/cuda-ci-setup.sh's
# compiler wheels), stripped and packed into .gpu/, and SmolLM2 split into two parts, so that
# each of check.sh's two calls stays within the device tool's 64 MiB:
#
#   .gpu/bin.tar.xz             radix-serve, device-bench, cache-bench and the test binaries
#                               cuda_attention, cuda_delta_net (radix-kernels); model_parity,
#                               device_parity, state_pool_devices, qwen35_shape_parity (radix-models)
#   .gpu/smollm2.part0          the first 43 MB of the SmolLM2 GGUF       (call 1 carries .gpu)
#   .gpu-model/smollm2.part1    the rest                                  (call 2 carries .gpu-model)
#   .gpu/smollm2.sha256         the whole file's sha256
#
# The Qwen3.5-0.8B-shaped checkpoint (1.6 GB) is not carried: check.sh writes it there with the
# image's torch (scripts/gen_qwen35_shaped.py's write_checkpoint, seeded). Both folders are
# git-ignored (.git/info/exclude). The device tool sends the checkout the session started in:
# run this there (after merging), not in a helper's worktree.
#
#   benches/gpu/prepare.sh            build and pack (~25 min cold on 2 cores, ~2 min warm)
#   benches/gpu/prepare.sh --dry-run  check the setup, the assets and what would be built; build nothing
#
# Never source cuda-ci-setup.sh on a machine with a real NVIDIA driver (its stub hides libcuda);
# there, build with the installed toolkit instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
dry=0
if [ "${1:-}" = --dry-run ]; then dry=1; fi

kernel_tests=(cuda_attention cuda_delta_net)
model_tests=(model_parity device_parity state_pool_devices qwen35_shape_parity)
bins=(radix-serve device-bench cache-bench)
setup="${CUDA_CI_SETUP:-../shared/cuda-ci-setup.sh}"
[ -f "$setup" ] || { echo "prepare.sh: $setup not found (set CUDA_CI_SETUP)" >&2; exit 1; }
model=$(scripts/assets.sh path smollm2)
[ -f "$model" ] || { echo "prepare.sh: SmolLM2 is not in the asset cache: run scripts/assets.sh fetch smollm2" >&2; exit 1; }
for t in "${kernel_tests[@]}"; do [ -f "kernels/tests/$t.rs" ] || { echo "prepare.sh: kernels/tests/$t.rs is gone" >&2; exit 1; }; done
for t in "${model_tests[@]}"; do [ -f "models/tests/$t.rs" ] || { echo "prepare.sh: models/tests/$t.rs is gone" >&2; exit 1; }; done
if [ "$dry" = 1 ]; then
  echo "prepare.sh --dry-run: would source $setup, build with CUDA_COMPUTE_CAP=90 into ${CARGO_TARGET_DIR:-$HOME/.cache/radix-serve/target-cuda}:"
  echo "  tests: ${kernel_tests[*]} (radix-kernels) ${model_tests[*]} (radix-models)"
  echo "  binaries: ${bins[*]}"
  echo "  pack .gpu/bin.tar.xz; split $model ($(stat -c %s "$model") bytes) into .gpu/smollm2.part0 + .gpu-model/smollm2.part1"
  exit 0
fi

# shellcheck disable=SC1090
. "$setup"
export CUDA_COMPUTE_CAP=90 CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/radix-serve/target-cuda}"
test_args=()
for t in "${kernel_tests[@]}" "${model_tests[@]}"; do test_args+=(--test "$t"); done
tests_json=$(cargo test --no-run --message-format=json -p radix-kernels -p radix-models \
  --features radix-kernels/cuda,radix-models/cuda "${test_args[@]}")
bin_args=()
for b in "${bins[@]}"; do bin_args+=(--bin "$b"); done
cargo build -p radix-serve -p radix-benches --features radix-serve/cuda,radix-benches/cuda "${bin_args[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
echo "$tests_json" | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], sys.argv[1] + "/" + m["target"]["name"])
' "$stage"
for b in "${bins[@]}"; do cp "$CARGO_TARGET_DIR/debug/$b" "$stage/"; done
for t in "${kernel_tests[@]}" "${model_tests[@]}" "${bins[@]}"; do
  [ -x "$stage/$t" ] || { echo "prepare.sh: $t was not built" >&2; exit 1; }
done
strip "$stage"/*
mkdir -p .gpu .gpu-model
# One large xz window: the binaries share candle's embedded kernels, which then compress once.
tar -cf - -C "$stage" . | xz -T2 -6 --lzma2=preset=6,dict=192MiB >.gpu/bin.tar.xz
sha256sum "$model" | cut -d' ' -f1 >.gpu/smollm2.sha256
# Call 1 carries the tree, the binaries and part 0; call 2 the tree and part 1: each within
# the device tool's 64 MiB.
first=43000000
head -c "$first" "$model" >.gpu/smollm2.part0
tail -c +"$((first + 1))" "$model" >.gpu-model/smollm2.part1
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
grep -qx '/.gpu-model/' .git/info/exclude 2>/dev/null || echo '/.gpu-model/' >>.git/info/exclude
du -sh .gpu .gpu-model >&2
tree_mb=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "prepare.sh: tracked tree $((tree_mb / 1000000)) MB; call 1 carries it + .gpu ($(du -sb .gpu | cut -f1) bytes), call 2 + .gpu-model ($(du -sb .gpu-model | cut -f1) bytes); each must stay under 64 MiB" >&2
