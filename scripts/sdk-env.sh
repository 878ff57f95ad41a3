#!/usr/bin/env bash
# Creates (once) a virtualenv with the official OpenAI and Anthropic Python SDKs at the versions and
# hashes pinned in tests/python/requirements.txt, and prints its python's path on stdout (all else
# goes to stderr). tests/tests/sdk_clients.rs runs the SDK test scripts with that python.
# Reinstalls only when requirements.txt changes. $RADIX_SDKENV overrides the location.
set -euo pipefail
cd "$(dirname "$0")/.."

env_dir="${RADIX_SDKENV:-$HOME/.cache/radix-serve/sdkenv}"
requirements="tests/python/requirements.txt"
python="$env_dir/bin/python"
stamp="$env_dir/.requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

if [[ -x "$python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "$python"
    exit 0
fi

echo "sdk-env: installing $requirements into $env_dir" >&2
rm -rf "$env_dir"
python3 -m venv "$env_dir"
# --require-hashes: every package, dependencies included, must match a pinned sha256.
"$python" -m pip install --quiet --disable-pip-version-check --no-cache-dir --require-hashes --only-binary :all: \
    -r "$requirements" >&2
"$python" -c 'import openai, anthropic; print("sdk-env: openai", openai.__version__, "anthropic", anthropic.__version__)' >&2
echo "$want" >"$stamp"
echo "$python"
