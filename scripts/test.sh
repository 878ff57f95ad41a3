#!/usr/bin/env bash
# Runs every test of the workspace, as CI does: formatting, clippy, unit, property, parity and
# end-to-end tests. Third-party assets are fetched (pinned, sha256-checked) through assets.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== Chromium (Debian's package, for tests/tests/ui_page.rs), installed in the background"
# Downloading and unpacking take ~20-30 s, mostly waiting on the network and the disk: they
# overlap the fetches and the build below, and the tests wait for them.
chromium_log="$(mktemp)"
scripts/chromium.sh >"$chromium_log" 2>&1 &
chromium_pid=$!
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
if wait "$chromium_pid"; then
  RADIX_CHROMIUM="$(tail -n 1 "$chromium_log")"
  export RADIX_CHROMIUM
  echo "== Chromium: $RADIX_CHROMIUM"
else
  echo "== no Chromium: the browser part of tests/tests/ui_page.rs is skipped"
  cat "$chromium_log"
fi
rm -f "$chromium_log"
cargo test --workspace --locked
