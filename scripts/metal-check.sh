#!/usr/bin/env bash
# Type-checks the Metal path for macOS (aarch64-apple-darwin) from Linux, as CI does: every crate
# and target with feature `metal`, candle's Metal backend included. `cargo check` links nothing,
# so the C parts of dependencies (ring) get a stand-in compiler that builds nothing; what is
# checked is all the Rust, ours and candle's. Nothing runs: there is no Mac here.
# Needs the target's standard library (`rustup target add aarch64-apple-darwin`, done here when
# rustup is available). Cold ~5 min on 2 cores; target directory ~/.cache/radix-serve/target-mac.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-apple-darwin
if ! rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  if ! rustup target add "$target" >&2; then
    echo "metal-check: SKIPPED: cannot install the $target standard library (rustup target add failed)" >&2
    exit 0
  fi
fi
export CARGO_TARGET_DIR="${METAL_TARGET_DIR:-$HOME/.cache/radix-serve/target-mac}"
export CC_aarch64_apple_darwin=/bin/true AR_aarch64_apple_darwin=/bin/true
echo "== cargo check --target $target --features metal"
cargo check --target "$target" --workspace --all-targets --locked \
  --features radix-serve/metal,radix-benches/metal,radix-models/metal
