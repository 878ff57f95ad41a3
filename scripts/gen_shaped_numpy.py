#!/usr/bin/env python3
"""Writes a random-weight F16 GGUF of a Qwen3 or Qwen3.5 shape with numpy and llama.cpp's own
gguf-py (no torch, no transformers), for benchmarks where the reference venv of
gen_qwen3_shaped.py and gen_qwen35_shaped.py cannot be installed. `llama-quantize` then makes the
Q4_K_M file.

Shapes (`--shape`):
  qwen3-0.6b           Qwen3-0.6B: 28 layers, hidden 1024, 16 / 8 heads of dim 128, MLP 3072,
                       q/k norms, tied embeddings, rope_theta 1e6.
  qwen3moe-30b-a3b-2l  Qwen3-30B-A3B's layers (hidden 2048, 32 / 4 heads of dim 128, 128 experts
                       of width 768, top-8, untied head), 2 of its 48 layers (the reason is in
                       gen_qwen35_shaped.py).
  qwen35-0.8b          Qwen3.5-0.8B's text model, gen_qwen35_shaped.py's shape: 24 layers, hidden
                       1024, MLP 3584, full attention every 4th layer (8 query / 2 KV heads of dim
                       256, output gate, rotary on 64 of 256 dims in interleaved sections
                       [11, 11, 10], rope_theta 1e7), Gated DeltaNet in the others (16 key / 16
                       value heads of dim 128, conv kernel 4), tied embeddings, vocab 248,320,
                       context 262,144.

Tokenizer. The Qwen3 shapes copy it (vocabulary, merges, special ids, chat template) from a
donor GGUF with the same 151,936-token Qwen2 BPE vocabulary: the real
Qwen2.5-Coder-0.5B-Instruct file (`scripts/bench-model.sh qwen-coder`), `--donor`. The Qwen3.5
shape takes Qwen3.5's own (248,077 tokens, padded to the model's 248,320 rows with `[PADn]` as
the converter pads) from a Hugging Face tokenizer directory, `--tokenizer`: the one our writer
builds from the tiktoken ranks (`cargo run -p radix-models --example write_qwen35_tokenizer`, as
`scripts/bench-model.sh qwen35` does). Its metadata is what llama.cpp's converter writes from
that directory (token types, `tokenizer.ggml.pre` "qwen35", gguf-py's SpecialVocab for the
merges, special ids and chat template), without transformers.

Weights: normal with std 0.02 (norms 1 ± 0.05), seeded. The Qwen3.5 shape also follows
gen_qwen35_shaped.py's draws where they matter to what the model computes: embeddings of std
0.2, conv kernels of std 0.3, dt bias 1, A_log = log(uniform(1, 16)); stored as the converter
stores them (ssm_a = -exp(A_log), Qwen3.5's 1 + w norms with the 1 folded in, so every norm is
1 ± 0.05 here as there). Tensor names, layouts, which tensors are F32 and metadata keys are
llama.cpp's (the converter's) for `qwen3`, `qwen3moe` and `qwen35`; the values differ from the
torch generators' draws, so a file made here is not byte-equal to one made there (ratios against
llama.cpp on the same file are what count).

MTP (`--mtp`, the Qwen3.5 shapes). One multi-token-prediction ("nextn") block after the model's L
layers, as the converter's _QwenMtpMixin writes a Qwen3.5/3.6 checkpoint's `mtp.*` tensors:
`block_count` L + 1, `qwen35.nextn_predict_layers` 1, the recurrent-layer flags extended with a
false (the block is full attention), and at block L a full-attention layer's tensors plus
`nextn.eh_proj` ({2 n_embd, n_embd}: concat(enorm(embedding), hnorm(hidden)) -> n_embd),
`nextn.enorm`, `nextn.hnorm` and `nextn.shared_head_norm`; the embedding and LM head are the
model's (no `nextn.embed_tokens` / `nextn.shared_head_head`). Drawn after the L layers, as they
are, so the L layers' values are the ones of the file without `--mtp`.

    python3 gen_shaped_numpy.py --shape qwen3-0.6b --gguf-py DIR --donor FILE.gguf --out F16.gguf
    python3 gen_shaped_numpy.py --shape qwen35-0.8b --gguf-py DIR --tokenizer DIR --out F16.gguf
    python3 gen_shaped_numpy.py --shape qwen35-0.8b --mtp --gguf-py DIR --tokenizer DIR --out F16.gguf
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

SHAPES = {
    "qwen3-0.6b": dict(arch="qwen3", layers=28, hidden=1024, heads=16, kv=8, head_dim=128, ffn=3072,
                       tied=True, ctx=40960),
    "qwen3moe-30b-a3b-2l": dict(arch="qwen3moe", layers=2, hidden=2048, heads=32, kv=4, head_dim=128, ffn=6144,
                                experts=128, used=8, expert_ffn=768, tied=False, ctx=40960),
    # Qwen3.5-0.8B: gen_qwen35_shaped.py's QWEN35_08B config, as llama.cpp's converter writes it.
    "qwen35-0.8b": dict(arch="qwen35", layers=24, hidden=1024, heads=8, kv=2, head_dim=256, ffn=3584,
                        tied=True, ctx=262144, rope_theta=1e7, rotary_dim=64, rope_sections=[11, 11, 10, 0],
                        full_attention_interval=4, conv_kernel=4, linear_key_heads=16, linear_value_heads=16,
                        linear_key_dim=128, linear_value_dim=128, vocab=248320, embed_std=0.2),
}
# gen_qwen35_shaped.py's QWEN35_MINI: Qwen3.5's structure in 4 small layers, for cache replays.
SHAPES["qwen35-mini"] = dict(SHAPES["qwen35-0.8b"], layers=4, hidden=256, ffn=512, heads=2, kv=1,
                             linear_key_heads=2, linear_value_heads=2)


def qwen35_tokenizer(w, gguf, tok_dir, vocab_size):
    """The converter's `_set_vocab_gpt2` for a Qwen3.5 tokenizer directory, from its JSON alone:
    `get_vocab_base` (ids padded with `[PADn]`; added tokens CONTROL when special or `<|...|>`,
    USER_DEFINED otherwise), the pre-tokenizer its check-text hash names, and SpecialVocab."""
    tok_dir = Path(tok_dir)
    tj = json.loads((tok_dir / "tokenizer.json").read_text(encoding="utf-8"))
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    added = {t["id"]: t for t in tj.get("added_tokens", [])}
    by_id.update((i, t["content"]) for i, t in added.items())
    if max(by_id) >= vocab_size:
        raise SystemExit(f"tokenizer has id {max(by_id)}, the model only {vocab_size} rows")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
            continue
        token = by_id[i]
        if i in added:
            special = added[i].get("special") or (token.startswith("<|") and token.endswith("|>"))
            types.append(int(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED))
        else:
            types.append(int(gguf.TokenType.NORMAL))
        tokens.append(token)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(tok_dir, load_merges=True, n_vocab=vocab_size).add_to_gguf(w, quiet=True)
    return len(by_id)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", required=True, choices=SHAPES)
    p.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py directory")
    p.add_argument("--donor", help="a GGUF with the Qwen2 BPE tokenizer (the Qwen3 shapes)")
    p.add_argument("--tokenizer", help="a Qwen3.5 tokenizer directory, tokenizer.json + tokenizer_config.json "
                   "(the Qwen3.5 shape)")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mtp", action="store_true", help="append one MTP (nextn) block after the layers "
                   "(the Qwen3.5 shapes)")
    a = p.parse_args()
    s = SHAPES[a.shape]
    qwen35 = s["arch"] == "qwen35"
    if a.mtp and not qwen35:
        p.error(f"--mtp is for the Qwen3.5 shapes ({', '.join(k for k, v in SHAPES.items() if v['arch'] == 'qwen35')}), "
                f"not {a.shape}")
    if qwen35 and not a.tokenizer:
        p.error(f"--shape {a.shape} needs --tokenizer")
    if not qwen35 and not a.donor:
        p.error(f"--shape {a.shape} needs --donor")
    sys.path.insert(0, a.gguf_py)
    import gguf

    rng = np.random.default_rng(a.seed)
    arch = s["arch"]
    w = gguf.GGUFWriter(a.out, arch)
    if qwen35:
        vocab = s["vocab"]
    else:
        donor = gguf.GGUFReader(a.donor)
        vocab = len(donor.fields["tokenizer.ggml.tokens"].contents())
    w.add_name(f"{a.shape}{'-mtp' if a.mtp else ''}-shaped-seed{a.seed}")
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["hidden"])
    # _QwenMtpMixin: the MTP block counts in block_count.
    w.add_block_count(s["layers"] + (1 if a.mtp else 0))
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s.get("rope_theta", 1e6))
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["used"])
        w.add_expert_feed_forward_length(s["expert_ffn"])
    if qwen35:
        # Qwen3NextModel.set_gguf_parameters and _Qwen35MRopeMixin in the converter.
        n_layer, interval = s["layers"], s["full_attention_interval"]
        recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
        if a.mtp:
            # The converter's recurrent flags cover block_count, the MTP block false (full
            # attention); llama.cpp checks the array's length against block_count.
            recurrent.append(False)
            w.add_nextn_predict_layers(1)
        w.add_rope_dimension_sections(s["rope_sections"])
        w.add_ssm_conv_kernel(s["conv_kernel"])
        w.add_ssm_state_size(s["linear_key_dim"])
        w.add_ssm_group_count(s["linear_key_heads"])
        w.add_ssm_time_step_rank(s["linear_value_heads"])
        w.add_ssm_inner_size(s["linear_value_dim"] * s["linear_value_heads"])
        w.add_recurrent_layers(recurrent)
        w.add_full_attention_interval(interval)
        w.add_rope_dimension_count(s["rotary_dim"])
        n_tokens = qwen35_tokenizer(w, gguf, a.tokenizer, vocab)
    else:
        n_tokens = vocab
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
    embed_std = s.get("embed_std", 0.02)
    w.add_tensor("token_embd.weight", normal(vocab, h, std=embed_std))
    if not s["tied"]:
        w.add_tensor("output.weight", normal(vocab, h, std=embed_std))
    w.add_tensor("output_norm.weight", norm(h))

    def full_attention(b):
        # Qwen3.5's attn_q holds the query and the output gate of each head: 2x the rows.
        w.add_tensor(b + "attn_q.weight", normal(s["heads"] * hd * (2 if qwen35 else 1), h))
        w.add_tensor(b + "attn_k.weight", normal(s["kv"] * hd, h))
        w.add_tensor(b + "attn_v.weight", normal(s["kv"] * hd, h))
        w.add_tensor(b + "attn_output.weight", normal(h, s["heads"] * hd))
        w.add_tensor(b + "attn_q_norm.weight", norm(hd))
        w.add_tensor(b + "attn_k_norm.weight", norm(hd))

    for i in range(s["layers"]):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", norm(h))
        if qwen35 and recurrent[i]:
            # Gated DeltaNet (llama_model_qwen35::load_arch_tensors; names from the converter's
            # linear_attn.* mapping). 16 key heads = 16 value heads, so no V-head reordering.
            nk, nv = s["linear_key_heads"], s["linear_value_heads"]
            dk, dv = s["linear_key_dim"], s["linear_value_dim"]
            conv = 2 * nk * dk + nv * dv
            w.add_tensor(b + "attn_qkv.weight", normal(conv, h))
            w.add_tensor(b + "attn_gate.weight", normal(nv * dv, h))
            w.add_tensor(b + "ssm_beta.weight", normal(nv, h))
            w.add_tensor(b + "ssm_alpha.weight", normal(nv, h))
            # conv1d squeezed to [channels, kernel]; F32, as the converter keeps SSM_CONV1D.
            w.add_tensor(b + "ssm_conv1d.weight",
                         (rng.standard_normal((conv, s["conv_kernel"]), dtype=np.float32) * 0.3).astype(np.float32))
            w.add_tensor(b + "ssm_dt.bias", np.ones(nv, dtype=np.float32))
            # ssm_a = -exp(A_log), A_log = log(uniform(1, 16)).
            w.add_tensor(b + "ssm_a", -rng.uniform(1.0, 16.0, nv).astype(np.float32))
            w.add_tensor(b + "ssm_norm.weight", norm(dv))
            w.add_tensor(b + "ssm_out.weight", normal(h, nv * dv))
        else:
            full_attention(b)
        # Qwen3.5 names its pre-MLP norm post_attention_norm (ATTN_POST_NORM), Qwen3 ffn_norm.
        w.add_tensor(b + ("post_attention_norm.weight" if qwen35 else "ffn_norm.weight"), norm(h))
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
    if a.mtp:
        # llama_model_qwen35::load_block_mtp: a full-attention block (the converter maps
        # mtp.layers.0.* to blk.L.*) and the nextn tensors (mtp.fc -> eh_proj,
        # pre_fc_norm_embedding -> enorm, pre_fc_norm_hidden -> hnorm, norm -> shared_head_norm;
        # 1 + w norms with the 1 folded in like the others). eh_proj's input is
        # concat(enorm(embedding), hnorm(hidden)), 2 * hidden wide.
        b = f"blk.{s['layers']}."
        w.add_tensor(b + "nextn.eh_proj.weight", normal(h, 2 * h))
        w.add_tensor(b + "nextn.enorm.weight", norm(h))
        w.add_tensor(b + "nextn.hnorm.weight", norm(h))
        w.add_tensor(b + "attn_norm.weight", norm(h))
        full_attention(b)
        w.add_tensor(b + "post_attention_norm.weight", norm(h))
        w.add_tensor(b + "ffn_gate.weight", normal(s["ffn"], h))
        w.add_tensor(b + "ffn_up.weight", normal(s["ffn"], h))
        w.add_tensor(b + "ffn_down.weight", normal(h, s["ffn"]))
        w.add_tensor(b + "nextn.shared_head_norm.weight", norm(h))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.out} ({arch}, vocab {vocab}, {n_tokens} tokens{', MTP block' if a.mtp else ''})", file=sys.stderr)


if __name__ == "__main__":
    main()
