#!/usr/bin/env bash
# Makes the README's screenshot of the cache page (docs/cache-page.png): runs the browser test
# (tests/tests/ui_page.rs), whose agent sessions and screenshot are the same in CI, writing the
# screenshot there. Needs Chromium (scripts/chromium.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
RADIX_CHROMIUM="${RADIX_CHROMIUM:-$(scripts/chromium.sh)}"
export RADIX_CHROMIUM RADIX_REQUIRE_CHROMIUM=1
export RADIX_UI_SCREENSHOT="$PWD/docs/cache-page.png"
mkdir -p docs
cargo build -p radix-serve
cargo test -p radix-e2e --test ui_page -- --nocapture
