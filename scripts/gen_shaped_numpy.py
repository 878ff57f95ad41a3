#!/usr/bin/env python3
"""Writes a random-weight F16 GGUF of a Qwen3 shape with numpy and llama.cpp's own gguf-py (no
torch, no transformers), for benchmarks where the reference venv of gen_qwen3_shaped.py and
gen_qwen35_shaped.py cannot be installed. `llama-quantize` then makes the Q4_K_M file.

Shapes (`--shape`):
  qwen3-0.6b           Qwen3-0.6B: 28 layers, hidden 1024, 16 / 8 heads of dim 128, MLP 3072,
                       q/k norms, tied embeddings, rope_theta 1e6.
  qwen3moe-30b-a3b-2l  Qwen3-30B-A3B's layers (hidden 2048, 32 / 4 heads of dim 128, 128 experts
                       of width 768, top-8, untied head), 2 of its 48 layers (the reason is in
                       gen_qwen35_shaped.py).

The tokenizer (vocabulary, merges, special ids, chat template) is copied from a donor GGUF with
the same 151,936-token Qwen2 BPE vocabulary: the real Qwen2.5-Coder-0.5B-Instruct file
(`scripts/bench-model.sh qwen-coder`). Weights: normal with std 0.02 (norms 1 ± 0.05), seeded.
Tensor names, layouts and metadata keys are llama.cpp's (the converter's) for `qwen3` and
`qwen3moe`; the values differ from gen_qwen3_shaped.py's torch draw, so a file made here is
not byte-equal to one made there (ratios against llama.cpp on the same file are what count).

    python3 gen_shaped_numpy.py --shape qwen3-0.6b --gguf-py DIR --donor FILE.gguf --out F16.gguf
"""

import argparse
import sys

import numpy as np

SHAPES = {
    "qwen3-0.6b": dict(arch="qwen3", layers=28, hidden=1024, heads=16, kv=8, head_dim=128, ffn=3072,
                       tied=True, ctx=40960),
    "qwen3moe-30b-a3b-2l": dict(arch="qwen3moe", layers=2, hidden=2048, heads=32, kv=4, head_dim=128, ffn=6144,
                                experts=128, used=8, expert_ffn=768, tied=False, ctx=40960),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", required=True, choices=SHAPES)
    p.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py directory")
    p.add_argument("--donor", required=True, help="a GGUF with the Qwen2 BPE tokenizer")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    sys.path.insert(0, a.gguf_py)
    import gguf

    s = SHAPES[a.shape]
    rng = np.random.default_rng(a.seed)
    donor = gguf.GGUFReader(a.donor)
    vocab = len(donor.fields["tokenizer.ggml.tokens"].contents())
    w = gguf.GGUFWriter(a.out, s["arch"])
    arch = s["arch"]
    w.add_name(f"{a.shape}-shaped-seed{a.seed}")
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["hidden"])
    w.add_block_count(s["layers"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["used"])
        w.add_expert_feed_forward_length(s["expert_ffn"])
    for key, field in donor.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, vtype)

    def normal(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)

    def norm(n):
        return (1.0 + 0.05 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    h, hd = s["hidden"], s["head_dim"]
    w.add_tensor("token_embd.weight", normal(vocab, h))
    if not s["tied"]:
        w.add_tensor("output.weight", normal(vocab, h))
    w.add_tensor("output_norm.weight", norm(h))
    for i in range(s["layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm(h))
        w.add_tensor(b + "attn_q.weight", normal(s["heads"] * hd, h))
        w.add_tensor(b + "attn_k.weight", normal(s["kv"] * hd, h))
        w.add_tensor(b + "attn_v.weight", normal(s["kv"] * hd, h))
        w.add_tensor(b + "attn_output.weight", normal(h, s["heads"] * hd))
        w.add_tensor(b + "attn_q_norm.weight", norm(hd))
        w.add_tensor(b + "attn_k_norm.weight", norm(hd))
        w.add_tensor(b + "ffn_norm.weight", norm(h))
        if "experts" in s:
            e, f = s["experts"], s["expert_ffn"]
            w.add_tensor(b + "ffn_gate_inp.weight", normal(e, h).astype(np.float32))
            w.add_tensor(b + "ffn_gate_exps.weight", normal(e, f, h))
            w.add_tensor(b + "ffn_up_exps.weight", normal(e, f, h))
            w.add_tensor(b + "ffn_down_exps.weight", normal(e, h, f))
        else:
            w.add_tensor(b + "ffn_gate.weight", normal(s["ffn"], h))
            w.add_tensor(b + "ffn_up.weight", normal(s["ffn"], h))
            w.add_tensor(b + "ffn_down.weight", normal(h, s["ffn"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out} ({arch}, vocab {vocab})", file=sys.stderr)


if __name__ == "__main__":
    main()
