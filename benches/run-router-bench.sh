#!/usr/bin/env bash
# Prefix reuse through SGLang's router: three release radix-serve instances on SmolLM2 behind
# sglang-router (pinned, installed by scripts/router-env.sh), the same interleaved agent sessions
# replayed on one instance alone and through the router with cache_aware, round_robin and manual
# (routing keys), then cache_aware with the busiest instance killed mid-replay. It is the ignored
# end-to-end test tests/tests/router.rs `three_instances_behind_sglang_router` (which asserts
# cache_aware within 2 points of one instance, sessions pinned by their key, and no hang after the
# kill); this prints its table. 3 to 8 minutes on 2 busy cores. Not a timing benchmark.
#
#   benches/run-router-bench.sh      the report also goes to target/router-bench/report.txt
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/router-env.sh >/dev/null
echo "run-router-bench: building radix-serve and the test (release)" >&2
cargo build --release -p radix-serve -p radix-benches --bin radix-serve >&2
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p "$target_dir/router-bench"
log="$target_dir/router-bench/test.log"
cargo test --release -p radix-e2e --test router -- --ignored --nocapture three_instances_behind_sglang_router \
    >"$log" 2>&1 || { tail -n 60 "$log" >&2; echo "run-router-bench: the test failed; its log: $log" >&2; exit 1; }
grep -A 7 '^== router test' "$log" | tee "$target_dir/router-bench/report.txt"
