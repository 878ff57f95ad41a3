#!/usr/bin/env bash
# Records real OpenCode traffic for cache-bench's `recorded` workload: the pinned OpenCode CLI
# (scripts/assets.sh) runs coding tasks in two small git repositories (two folders, so two
# working directories in the system prompt), a new session and then continued ones, then two
# subagents, then two new sessions at once, against radix-serve on its default model
# (Qwen2.5-Coder-0.5B-Instruct, which calls OpenCode's tools) with --record-requests. The file
# holds OpenCode's own system prompt and tool schemas, so it stays in the cache directory and is
# never committed.
#
#   benches/record-opencode.sh [OUT.jsonl]    default ~/.cache/radix-serve/recorded/opencode.jsonl
#
# Then replay it on any model, e.g. the Qwen3.5 shape against llama-server:
#   MODEL=qwen35 WORKLOADS=recorded RECORDED=OUT.jsonl benches/run-cache-bench.sh
# Takes ~10 minutes on 2 cores (the first request prefills OpenCode's ~7k-token prefix cold).
set -euo pipefail
cd "$(dirname "$0")/.."

out="${1:-$HOME/.cache/radix-serve/recorded/opencode.jsonl}"
mkdir -p "$(dirname "$out")"
rm -f "$out"
log() { echo "record-opencode: $*" >&2; }

cargo build --release -p radix-serve -p radix-benches --bin radix-serve >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
server="$target_dir/release/radix-serve"
opencode=$(scripts/assets.sh path opencode)
rg=$(scripts/assets.sh path ripgrep)
model=$("$server" default-model)

work=$(mktemp -d)
trap 'kill "${server_pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
home="$work/home"
mkdir -p "$home"

# Two small projects.
make_repo() {
  local repo="$work/$1"
  mkdir -p "$repo/src"
  printf 'The secret word is %s.\n' "$2" > "$repo/notes.txt"
  for i in $(seq 2 30); do printf 'Line %d of the notes.\n' "$i" >> "$repo/notes.txt"; done
  printf 'fn main() {\n    println!("hello from %s");\n}\n' "$1" > "$repo/src/main.rs"
  printf '[package]\nname = "%s"\nversion = "0.1.0"\nedition = "2021"\n' "$1" > "$repo/Cargo.toml"
  git -C "$repo" init -q
  git -C "$repo" add .
  git -C "$repo" -c user.email=t@example.com -c user.name=t commit -qm init
}
make_repo alpha pelican
make_repo beta heron

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$server" -m "$model" --port "$port" --threads 2 --record-requests "$out" > "$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  sleep 1
done
name=$(curl -sf "http://127.0.0.1:$port/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')

run() {
  local repo="$work/$1"
  shift
  cat > "$repo/opencode.json" <<EOF
{"\$schema": "https://opencode.ai/config.json",
 "provider": {"radix": {"npm": "@ai-sdk/openai-compatible", "name": "radix-serve",
   "options": {"baseURL": "http://127.0.0.1:$port/v1"},
   "models": {"$name": {"name": "Qwen2.5 Coder 0.5B", "tool_call": true}}}},
 "agent": {"general": {"mode": "all"}, "explore": {"mode": "all"}},
 "model": "radix/$name", "autoupdate": false, "share": "disabled"}
EOF
  log "opencode $* (in $(basename "$repo"))"
  (cd "$repo" && PWD="$repo" HOME="$home" XDG_CONFIG_HOME="$home/.config" XDG_DATA_HOME="$home/.local/share" \
    XDG_CACHE_HOME="$home/.cache" XDG_STATE_HOME="$home/.local/state" PATH="$(dirname "$rg"):$PATH" \
    timeout 900 "$opencode" "$@" > /dev/null 2>&1) || log "opencode $1 ended with $? (the recording keeps what it sent)"
}

run alpha run "Use the read tool to read notes.txt, then tell me the secret word."
run alpha run --continue "Now read src/main.rs and tell me what it prints."
run beta run "Use the read tool to read notes.txt, then tell me the secret word."
run alpha run --continue "Which file did you read first?"
# Subagents (issue 32): OpenCode's general and explore agents (the 0.5B model does not call the
# task tool itself; `mode: all` above lets `run --agent` start them), with their own prompts and
# tools, so their first request branches from the main agent's inside the system block.
run beta run --agent general "Find which file prints a greeting and report its path."
run alpha run --agent explore "Which files does this project have?"
# Two sessions at once (issue 32): a new session in each folder, in flight together, so their
# requests (titles, tool calls) arrive interleaved and batch in the engine as two agents' would.
run alpha run "Read Cargo.toml and tell me the package name." &
first=$!
sleep 2
run beta run "Read src/main.rs and tell me what it prints." &
second=$!
wait "$first" "$second"
log "$(wc -l < "$out") requests recorded in $out"
echo "$out"
