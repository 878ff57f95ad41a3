#!/usr/bin/env bash
# Compile-checks the GPU paths on a machine without a GPU, as CI does after the tests:
#   - `cargo build` of every crate and target with feature `cuda` (candle's CUDA backend and our
#     kernels' PTX), linked against the CUDA 13 wheels and driver stub of
#     ../shared/cuda-ci-setup.sh;
#   - `cargo clippy --all-features` (cuda and metal: on Linux the Metal code is compiled out, so
#     this is also `cargo check --all-features`), warnings denied;
#   - our PTX through ptxas for sm_80 (Ampere) and sm_90 (Hopper).
# Nothing here runs on a GPU: benches/gpu/check.sh does that on a lent machine.
# Cold: ~15-20 min on 2 cores (candle's kernels dominate); warm: seconds. Target directory:
# $CUDA_TARGET_DIR, default ~/.cache/radix-serve/target-cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
# The setup lives beside the checkout (../shared), as on CI and the development machines.
setup="${CUDA_CI_SETUP:-../shared/cuda-ci-setup.sh}"
if [ ! -f "$setup" ]; then
  echo "cuda-check: SKIPPED: $setup (the CUDA compiler setup for machines without a GPU) is not here;" \
    "set CUDA_CI_SETUP to its path" >&2
  exit 0
fi
# shellcheck disable=SC1090
. "$setup"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP_BUILD:-90}"
export CARGO_TARGET_DIR="${CUDA_TARGET_DIR:-$HOME/.cache/radix-serve/target-cuda}"
features=radix-serve/cuda,radix-benches/cuda,radix-models/cuda,radix-kernels/cuda

echo "== cargo build --features cuda (all crates, all targets)"
cargo build --workspace --all-targets --locked --features "$features"
echo "== cargo clippy --all-features (cuda + metal)"
cargo clippy --workspace --all-targets --locked --all-features -- -D warnings
echo "== ptxas on our kernels"
ptx_dir=$(mktemp -d)
trap 'rm -rf "$ptx_dir"' EXIT
for cu in kernels/cuda/*.cu; do
  for arch in 80 90; do
    name="$ptx_dir/$(basename "$cu" .cu)_$arch"
    nvcc --ptx -O3 -std=c++17 --use_fast_math -arch="compute_$arch" -o "$name.ptx" "$cu"
    ptxas -arch="sm_$arch" -O3 -o "$name.cubin" "$name.ptx"
    echo "$cu: sm_$arch ok"
  done
done
