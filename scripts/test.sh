#!/usr/bin/env bash
# Runs every test of the workspace, as CI does: formatting, clippy, unit, property, parity and
# end-to-end tests. Third-party assets are fetched (pinned, sha256-checked) through assets.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== assets"
scripts/assets.sh fetch
echo "== SDK virtualenv (official OpenAI and Anthropic Python SDKs, pinned with hashes)"
scripts/sdk-env.sh
echo "== router virtualenv (SGLang's sglang-router, pinned with hashes; tests/tests/router.rs)"
scripts/router-env.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
# The end-to-end tests in tests/ run the real binary, which cargo does not build for another
# package's tests: build it first.
cargo build -p radix-serve --locked
cargo test --workspace --locked
