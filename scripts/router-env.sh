#!/usr/bin/env bash
# Creates (once) a virtualenv with SGLang's router (sglang-router, pinned with hashes in
# tests/python/router-requirements.txt) and prints the path of its launcher on stdout (all else goes
# to stderr). Run the router with `$(scripts/router-env.sh) launch --worker-urls ... --policy ...`;
# tests/tests/router.rs and benches/src/bin/router-bench.rs start it that way, README's "Many
# machines" section shows the commands. Reinstalls only when the requirements file changes.
# $RADIX_ROUTERENV overrides the location.
set -euo pipefail
cd "$(dirname "$0")/.."

env_dir="${RADIX_ROUTERENV:-$HOME/.cache/radix-serve/routerenv}"
requirements="tests/python/router-requirements.txt"
launcher="$env_dir/bin/smg"
python="$env_dir/bin/python"
stamp="$env_dir/.requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

if [[ -x "$launcher" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "$launcher"
    exit 0
fi

echo "router-env: installing $requirements into $env_dir" >&2
rm -rf "$env_dir"
python3 -m venv "$env_dir"
# --require-hashes: every package, dependencies included, must match a pinned sha256.
"$python" -m pip install --quiet --disable-pip-version-check --no-cache-dir --require-hashes --only-binary :all: \
    -r "$requirements" >&2
echo "router-env: sglang-router $("$launcher" --version | head -n1)" >&2
echo "$want" >"$stamp"
echo "$launcher"
