#!/usr/bin/env python3
"""Generate the model-runtime reference fixtures:

  models/tests/fixtures/tiny/{llama,qwen2,qwen3}/   tiny random-weight models + reference logits
  models/tests/fixtures/smollm2_greedy.json         SmolLM2-135M-Instruct (Q4_1 GGUF) greedy ids

CI never runs this script; it only reads the committed files. Run it by hand when the fixtures or
the pinned reference versions change, and commit the regenerated files.

Reference environment (pinned; recreate it with):

    python3.11 -m venv ~/.cache/radix-serve/refenv
    ~/.cache/radix-serve/refenv/bin/pip install \
        transformers==5.24.0 jinja2==3.1.6 gguf==0.19.0 tokenizers==0.23.3 \
        torch==2.15.0 safetensors==0.8.0 accelerate==1.15.0 numpy
    # accelerate is required by transformers to load a GGUF file.
    # Only the CPU is used; a CPU-only torch wheel
    # (--index-url https://download.pytorch.org/whl/cpu) is enough and much smaller.

Usage (from the repository root):

    ~/.cache/radix-serve/refenv/bin/python scripts/gen_model_refs.py              # everything
    ~/.cache/radix-serve/refenv/bin/python scripts/gen_model_refs.py --only tiny   # or smollm2

The binary fixtures are un-ignored by models/tests/fixtures/tiny/.gitignore (the root .gitignore
ignores *.gguf and *.safetensors). The output is deterministic: running the script twice gives
byte-identical files (fixed seeds, torch.set_num_threads(1), deterministic algorithms, sorted
JSON keys).

Tiny models (one folder per architecture, all float32)
------------------------------------------------------
Shapes: hidden 64, 2 layers, 4 query heads, 2 KV heads (GQA), intermediate 96, vocab 128,
max_position_embeddings 512, rms_norm_eps 1e-6.
  llama  rope_theta 1e4 with llama3 RoPE scaling (factor 8, low 1, high 4, original context 64:
         with head_dim 16 the 8 frequencies cover all three llama3 bands), untied lm_head.
  qwen2  rope_theta 1e6, q/k/v biases, tied embeddings.
  qwen3  rope_theta 1e6, explicit head_dim 32 (!= 64/4), q_norm/k_norm, tied embeddings.
Every parameter is re-initialised (seeded) with normal(0, 0.2), norms with 1 + normal(0, 0.2), so
no bias is zero and no norm is one.

Files per folder:
  config.json, model.safetensors   transformers' save_pretrained output (transformers 5 writes the
                                   RoPE settings as `rope_parameters` {rope_type, rope_theta, ...},
                                   not the legacy `rope_theta`/`rope_scaling` keys).
  model-f32.gguf                   every tensor F32.
  model-q8_0.gguf                  every 2-D `.weight` (token_embd and output included) Q8_0
                                   (gguf.quants.quantize); 1-D tensors (norms, biases, rope_freqs)
                                   F32. general.file_type 7 (MOSTLY_Q8_0).
  reference.json                   {"sequences": 3 seeded id lists (lengths 5, 11, 23),
                                    "logits_f32":  [seq][pos][128] from the transformers model
                                                   (eval, no cache, whole sequence in one forward),
                                    "logits_q8_0": the same with every weight that
                                                   model-q8_0.gguf stores as Q8_0 replaced by its
                                                   dequantized value,
                                    "arch", "transformers", "torch", "gguf" (versions)}
                                   Floats are rounded to 7 significant digits.

GGUF layout: as llama.cpp's convert_hf_to_gguf.py writes it.
  metadata  general.architecture (llama|qwen2|qwen3), general.name, general.file_type,
            general.quantization_version, {arch}.context_length, .embedding_length,
            .block_count, .feed_forward_length, .attention.head_count, .attention.head_count_kv,
            .rope.freq_base, .attention.layer_norm_rms_epsilon, .attention.key_length and
            .attention.value_length (= head_dim; only when config.json has head_dim, as the
            converter does: llama and qwen3 here, not qwen2), .vocab_size,
            .rope.dimension_count (= head_dim).
            llama3 RoPE scaling is NOT stored as metadata: like the converter
            (LlamaModel.generate_extra_tensors) we store a `rope_freqs.weight` F32 tensor of
            head_dim/2 divisors: freq_i = theta^(-2i/head_dim) / rope_freqs[i].
            A minimal tokenizer (tokenizer.ggml.model "gpt2", pre "default", ids 0..126 = bytes
            0x00..0x7e in GPT-2 byte-to-unicode form, id 127 = "ĠĠ" with the single merge
            "Ġ Ġ" (gguf-py cannot write an empty merges array), bos 1, eos 2, add_bos false).
  tensors   rope_freqs.weight (llama only, first), then in model.safetensors order:
            token_embd.weight, output_norm.weight, output.weight (absent when tied),
            blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm,
            ffn_norm, ffn_gate, ffn_up, ffn_down}.weight, blk.N.attn_{q,k,v}.bias.
            GGUF dims are listed innermost first (ne[0] = in_features); the data is the
            row-major [out, in] matrix of transformers.
            llama only: attn_q/attn_k weights are permuted as the converter's LlamaModel.permute
            (per head, rows reordered from the HF "rotate_half" layout [x0..x(d/2-1) | x(d/2)..]
            to llama.cpp's interleaved pairs (x0, x(d/2)), (x1, x(d/2+1)), ...):
                w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
            with n_head = head_count for attn_q and head_count_kv for attn_k.
            qwen2/qwen3 are NOT permuted (llama.cpp runs them with NEOX-style RoPE).

Checks (asserted): reading each GGUF back with transformers reproduces logits_f32 (model-f32.gguf)
and logits_q8_0 (model-q8_0.gguf) within 1e-4 relative L2. transformers' GGUF loader ignores
rope_freqs (llama3 scaling) and does not map qwen3's attention.key_length to head_dim, so the
asserted reload passes config=<the saved config.json> and takes only the tensors from the GGUF;
the pure-GGUF reload is also tried and its result printed. rope_freqs is also checked against
transformers' own llama3 inv_freq, and the GGUF metadata against the config.

SmolLM2 greedy reference
------------------------
`scripts/assets.sh path smollm2` (SmolLM2-135M-Instruct.Q4_1.gguf) loaded by transformers
(AutoTokenizer / AutoModelForCausalLM with gguf_file=, dequantized to float32). For 4 prompts of
ours rendered with the GGUF's chat template (add_generation_prompt=True): {"prompt", "prompt_ids",
"greedy_ids": 32 greedy ids (argmax of a full no-cache forward each step, NOT stopped at EOS),
"eos_index": first index in greedy_ids equal to eos_token_id, or null}. Top-level also has
eos_token_id and versions.
"""

import argparse
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import gguf
import transformers
from gguf import GGMLQuantizationType as QT
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "models" / "tests" / "fixtures"
TINY = FIXTURES / "tiny"

SEQ_LENS = [5, 11, 23]
REL_TOL = 1e-4

COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    vocab_size=128,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
)

ARCHS = {
    "llama": dict(
        cls="LlamaConfig",
        seed=1001,
        kwargs=dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=False,
        ),
    ),
    "qwen2": dict(
        cls="Qwen2Config",
        seed=1002,
        kwargs=dict(
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True,
        ),
    ),
    "qwen3": dict(
        cls="Qwen3Config",
        seed=1003,
        kwargs=dict(
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            head_dim=32,
            tie_word_embeddings=True,
        ),
    ),
}

# HF parameter name suffix -> GGUF tensor name (within blk.N).
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def versions():
    return {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "gguf": _gguf_version()}


def _gguf_version():
    from importlib.metadata import version
    return version("gguf")


def r7(x):
    """Round a float to 7 significant digits (as a JSON-friendly Python float)."""
    return float(f"{x:.7g}")


def round_logits(t):
    return [[r7(v) for v in row] for row in t.tolist()]


def write_json(path, obj):
    path.write_text(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")


def gguf_name(hf_name):
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".")
    assert parts[0] == "model" and parts[1] == "layers", hf_name
    return f"blk.{int(parts[2])}." + LAYER_MAP[".".join(parts[3:])]


def permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w, n_head, n_head_kv):
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def head_dim_of(cfg):
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def llama3_rope_freqs(cfg):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (llama3 rope_freqs)."""
    rp = cfg.rope_parameters
    base = rp["rope_theta"]
    dim = head_dim_of(cfg)
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rp.get("factor", 8.0)
    low_freq_factor = rp.get("low_freq_factor", 1.0)
    high_freq_factor = rp.get("high_freq_factor", 4.0)
    old_context_len = rp.get("original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    assert low_freq_wavelen != high_freq_wavelen
    rope_factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            rope_factors.append(1)
        elif wavelen > low_freq_wavelen:
            rope_factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            rope_factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(rope_factors, dtype=np.float32)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def build_model(arch):
    spec = ARCHS[arch]
    cfg_cls = getattr(transformers, spec["cls"])
    cfg = cfg_cls(**COMMON, **spec["kwargs"])
    cfg.dtype = torch.float32
    torch.manual_seed(spec["seed"])
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.eval()
    gen = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied params are listed once
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.2
            if "norm" in name:
                p.copy_(1.0 + noise)
            else:
                p.copy_(noise)
    return model


def forward_logits(model, seqs):
    out = []
    with torch.no_grad():
        for ids in seqs:
            x = torch.tensor([ids], dtype=torch.long)
            out.append(model(input_ids=x, use_cache=False).logits[0].to(torch.float32))
    return out


def rel_l2(a, b):
    a = torch.cat([t.flatten() for t in a]).double()
    b = torch.cat([t.flatten() for t in b]).double()
    return float((a - b).norm() / b.norm())


def write_gguf(folder, arch, cfg, quant):
    """Write model-{f32,q8_0}.gguf from folder/model.safetensors. Returns {hf_name: the weight as
    the file stores it, dequantized and un-permuted back to the HF layout} for quantized tensors."""
    path = folder / ("model-q8_0.gguf" if quant else "model-f32.gguf")
    w = gguf.GGUFWriter(str(path), arch)
    head_dim = head_dim_of(cfg)
    w.add_name(f"radix-serve tiny {arch}")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    saved = json.loads((folder / "config.json").read_text())
    if saved.get("head_dim") is not None:
        w.add_key_length(saved["head_dim"])
        w.add_value_length(saved["head_dim"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quant else gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(head_dim)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # minimal byte-level tokenizer
    b2u = bytes_to_unicode()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    # gguf-py refuses empty arrays and llama.cpp requires the merges key, so the last id is the
    # single merge "Ġ Ġ" -> "ĠĠ" (two spaces) instead of byte 0x7f.
    tokens = [b2u[b] for b in range(cfg.vocab_size - 1)] + [b2u[0x20] * 2]
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.NORMAL)] * cfg.vocab_size)
    w.add_token_merges([f"{b2u[0x20]} {b2u[0x20]}"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

    dequant = {}
    rope = cfg.rope_parameters.get("rope_type", "default")
    if rope == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(cfg))
    with safe_open(folder / "model.safetensors", framework="np") as f:
        for name in f.keys():
            data = f.get_tensor(name).astype(np.float32)
            new = gguf_name(name)
            if arch == "llama" and new.endswith("attn_q.weight"):
                data = permute(data, cfg.num_attention_heads, cfg.num_attention_heads)
            elif arch == "llama" and new.endswith("attn_k.weight"):
                data = permute(data, cfg.num_attention_heads, cfg.num_key_value_heads)
            data = np.ascontiguousarray(data)
            if quant and data.ndim == 2 and new.endswith(".weight"):
                q = gguf.quants.quantize(data, QT.Q8_0)
                w.add_tensor(new, q, raw_dtype=QT.Q8_0)
                dq = gguf.quants.dequantize(q, QT.Q8_0).reshape(data.shape)
                if arch == "llama" and new.endswith("attn_q.weight"):
                    dq = unpermute(dq, cfg.num_attention_heads, cfg.num_attention_heads)
                elif arch == "llama" and new.endswith("attn_k.weight"):
                    dq = unpermute(dq, cfg.num_attention_heads, cfg.num_key_value_heads)
                dequant[name] = dq
            else:
                w.add_tensor(new, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dequant


def check_gguf_metadata(path, arch, cfg, quant):
    r = gguf.GGUFReader(str(path))

    def val(key):
        fld = r.fields[key]
        v = fld.contents()
        return v

    assert val("general.architecture") == arch
    exp = {
        "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size,
        "block_count": cfg.num_hidden_layers,
        "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": cfg.num_key_value_heads,
        "vocab_size": cfg.vocab_size,
        "rope.dimension_count": head_dim_of(cfg),
    }
    if getattr(cfg, "head_dim", None) is not None:
        exp["attention.key_length"] = exp["attention.value_length"] = cfg.head_dim
    else:
        assert f"{arch}.attention.key_length" not in r.fields
    for k, v in exp.items():
        assert val(f"{arch}.{k}") == v, (arch, k, val(f"{arch}.{k}"), v)
    assert abs(val(f"{arch}.rope.freq_base") - cfg.rope_parameters["rope_theta"]) < 1e-3
    assert abs(val(f"{arch}.attention.layer_norm_rms_epsilon") - cfg.rms_norm_eps) < 1e-12
    names = {t.name: t for t in r.tensors}
    assert ("output.weight" in names) == (not cfg.tie_word_embeddings)
    assert ("rope_freqs.weight" in names) == (arch == "llama")
    for t in r.tensors:
        want = QT.Q8_0 if (quant and len(t.shape) == 2) else QT.F32
        assert t.tensor_type == want, (path, t.name, t.tensor_type)
    return sorted(names)


def load_from_gguf(folder, fname, config=None):
    kw = dict(gguf_file=fname, dtype=torch.float32)
    if config is not None:
        kw["config"] = config
    m = AutoModelForCausalLM.from_pretrained(str(folder), **kw)
    m.eval()
    return m


def gen_tiny(arch):
    folder = TINY / arch
    folder.mkdir(parents=True, exist_ok=True)
    model = build_model(arch)
    cfg = model.config
    model.save_pretrained(str(folder), safe_serialization=True)
    for extra in ("generation_config.json",):
        p = folder / extra
        if p.exists():
            p.unlink()

    rng = random.Random(7000 + list(ARCHS).index(arch))
    seqs = [[rng.randrange(cfg.vocab_size) for _ in range(n)] for n in SEQ_LENS]

    logits_f32 = forward_logits(model, seqs)

    # The saved safetensors must reproduce the model exactly.
    reloaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert rel_l2(forward_logits(reloaded, seqs), logits_f32) == 0.0, "safetensors reload differs"

    write_gguf(folder, arch, cfg, quant=False)
    dequant = write_gguf(folder, arch, cfg, quant=True)

    # Q8_0 reference: replace each weight the q8_0 file quantizes by its dequantized value.
    qmodel = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    sd = qmodel.state_dict()
    with torch.no_grad():
        for name, dq in dequant.items():
            sd[name].copy_(torch.from_numpy(dq))
    if cfg.tie_word_embeddings:
        assert qmodel.lm_head.weight.data_ptr() == qmodel.model.embed_tokens.weight.data_ptr()
    logits_q8 = forward_logits(qmodel, seqs)

    # rope_freqs vs transformers' own llama3 inverse frequencies.
    if arch == "llama":
        inv = model.model.rotary_emb.inv_freq.double()
        dim = head_dim_of(cfg)
        base_inv = 1.0 / (cfg.rope_parameters["rope_theta"]
                          ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        rf = torch.from_numpy(llama3_rope_freqs(cfg)).double()
        err = float(((base_inv / rf) - inv).abs().max() / inv.abs().max())
        print(f"[{arch}] rope_freqs {rf.tolist()} vs transformers llama3 inv_freq: max rel err {err:.2e}",
              file=sys.stderr)
        assert err < 1e-6

    results = {}
    for fname, ref, quant in (("model-f32.gguf", logits_f32, False), ("model-q8_0.gguf", logits_q8, True)):
        tensors = check_gguf_metadata(folder / fname, arch, cfg, quant)
        # Pure-GGUF reload (config from GGUF metadata): informative only.
        try:
            a = AutoConfig.from_pretrained(str(folder)).to_dict()
            b = AutoConfig.from_pretrained(str(folder), gguf_file=fname).to_dict()
            diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
                    if a.get(k) != b.get(k) and k not in ("_model_name_or_path", "architectures", "dtype")
                    and not (isinstance(a.get(k), float) and isinstance(b.get(k), float)
                             and abs(a[k] - b[k]) <= 1e-6 * abs(a[k]))}
            if diff:
                print(f"[{arch}] {fname}: config from GGUF metadata differs from config.json "
                      f"(config.json | GGUF): {diff}", file=sys.stderr)
        except Exception as ex:  # noqa: BLE001
            print(f"[{arch}] {fname}: config from GGUF metadata failed: {ex}", file=sys.stderr)
        try:
            m = load_from_gguf(folder, fname)
            e = rel_l2(forward_logits(m, seqs), ref)
            plain = f"rel L2 {e:.2e}" + ("" if e < REL_TOL else " (MISMATCH)")
        except Exception as ex:  # noqa: BLE001
            plain = f"failed: {type(ex).__name__}: {str(ex).splitlines()[0][:200]}"
        # Tensors from GGUF, config from config.json: asserted.
        m = load_from_gguf(folder, fname, config=AutoConfig.from_pretrained(str(folder)))
        e = rel_l2(forward_logits(m, seqs), ref)
        results[fname] = (plain, e)
        print(f"[{arch}] {fname}: {len(tensors)} tensors; pure-GGUF reload: {plain}; "
              f"GGUF tensors + config.json: rel L2 {e:.2e}", file=sys.stderr)
        assert e < REL_TOL, (arch, fname, e)

    print(f"[{arch}] q8_0 vs f32 logits rel L2 {rel_l2(logits_q8, logits_f32):.2e}", file=sys.stderr)

    ref = {
        "arch": arch,
        "sequences": seqs,
        "logits_f32": [round_logits(t) for t in logits_f32],
        "logits_q8_0": [round_logits(t) for t in logits_q8],
        **versions(),
    }
    write_json(folder / "reference.json", ref)
    return results


SMOL_PROMPTS = [
    "Write a Python function that returns the sum of the squares of a list of integers.",
    "What is the capital city of Australia?",
    "List five fruits that are red.",
    "Answer with one word only: what color is the sky on a clear day?",
]


def asset_path(name):
    return subprocess.run([str(REPO / "scripts" / "assets.sh"), "path", name], check=True,
                          capture_output=True, text=True).stdout.strip()


def gen_smollm2(n_new=32):
    path = Path(asset_path("smollm2"))
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    eos = tok.eos_token_id
    entries = []
    for prompt in SMOL_PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                      add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = [int(i) for i in ids]
        seq = list(ids)
        out = []
        with torch.no_grad():
            for _ in range(n_new):
                logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
                nxt = int(torch.argmax(logits))
                out.append(nxt)
                seq.append(nxt)
        eos_index = out.index(eos) if eos in out else None
        print(f"[smollm2] {prompt!r} -> {tok.decode(out)!r} (eos_index {eos_index})", file=sys.stderr)
        entries.append({"prompt": prompt, "prompt_ids": ids, "greedy_ids": out, "eos_index": eos_index})
    obj = {
        "model": path.name,
        "eos_token_id": eos,
        "n_new": n_new,
        "note": "greedy = argmax of a full no-cache float32 forward (Q4_1 weights dequantized by gguf-py); "
                "not stopped at EOS",
        "prompts": entries,
        **versions(),
    }
    write_json(FIXTURES / "smollm2_greedy.json", obj)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["tiny", "smollm2"])
    ap.add_argument("--arch", choices=list(ARCHS), action="append")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    if args.only in (None, "tiny"):
        for arch in args.arch or ARCHS:
            gen_tiny(arch)
    if args.only in (None, "smollm2"):
        gen_smollm2()


if __name__ == "__main__":
    main()
