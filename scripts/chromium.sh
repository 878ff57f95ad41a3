#!/usr/bin/env bash
# Chromium for the cache page's browser test (tests/tests/ui_page.rs): Debian's package, run
# headless and driven over its DevTools pipe (no WebDriver, no npm). Installed only when absent,
# without recommended packages, with the package lists already there; they are updated only when
# that fails (a fresh machine). Prints the browser's path; fails, saying why, when it cannot be had.
set -euo pipefail
for name in chromium chromium-browser; do
  if command -v "$name" >/dev/null; then
    command -v "$name"
    exit 0
  fi
done
if ! command -v apt-get >/dev/null; then
  echo "scripts/chromium.sh: no apt-get here: install Chromium yourself, or set RADIX_CHROMIUM to it" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null || ! sudo -n true 2>/dev/null; then
    echo "scripts/chromium.sh: installing Chromium needs root (apt-get install chromium)" >&2
    exit 1
  fi
  sudo=(sudo -n)
fi
install() {
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
}
if ! install 2>/dev/null; then
  "${sudo[@]}" apt-get update -qq >/dev/null
  install
fi
command -v chromium
