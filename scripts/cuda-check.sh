#!/usr/bin/env bash
# Compile-checks the GPU paths on a machine without a GPU, as CI does after the tests:
#   - `cargo clippy --all-features` of every crate and target (cuda and metal: on Linux the Metal
#     code is compiled out, so this is `cargo check` of the CUDA build, candle's CUDA backend and
#     the build script that compiles our kernels to PTX included), warnings denied, with the
#     CUDA 13 wheels and driver stub of ../shared/cuda-ci-setup.sh;
#   - our PTX through ptxas for sm_80 (Ampere) and sm_90 (Hopper).
# No `cargo build`: linking against the driver stub proves nothing a GPU run would not, and a
# second, codegen build of the whole tree was half of this check's cold time. The target
# directory is the tests' own ($CARGO_TARGET_DIR, as .ci/run sets it) unless CUDA_TARGET_DIR
# says otherwise, so every crate whose features do not change (most dependencies) is checked
# once for both. Nothing here runs on a GPU: benches/gpu/check.sh does that on a lent machine.
# Cold: ~10 min on 2 cores after the tests (candle's CUDA kernels through nvcc dominate).
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
export CARGO_TARGET_DIR="${CUDA_TARGET_DIR:-${CARGO_TARGET_DIR:-$HOME/.cache/radix-serve/target}}"
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
