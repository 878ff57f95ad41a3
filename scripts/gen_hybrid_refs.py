#!/usr/bin/env python3
"""Generate the tiny hybrid and MoE reference fixtures:

  models/tests/fixtures/tiny/{qwen3moe,qwen35,qwen35moe}/

Each folder: config.json + model.safetensors (transformers' save_pretrained), model-f32.gguf and
model-q8_0.gguf (written by llama.cpp's own converter, convert_hf_to_gguf.py, from the
llama-cpp-python 0.3.36 sdist that scripts/build-llama-cpp.sh unpacks), and reference.json
(transformers' logits). CI never runs this script; it reads the committed files. Run it by hand
when the fixtures or the pinned reference versions change, and commit the regenerated files.

Reference environment: the one scripts/gen_model_refs.py describes (transformers 5.24.0,
torch 2.15.0, safetensors, numpy; ~/.cache/radix-serve/refenv).

Usage (from the repository root):

    ~/.cache/radix-serve/refenv/bin/python scripts/gen_hybrid_refs.py \
        --llama-src ~/.cache/radix-serve/llama.cpp/0.3.36/src [--only qwen35]

Shapes (all float32, vocab 128, hidden 64, rms eps 1e-6, tied embeddings):
  qwen3moe   2 layers, 4 query / 2 KV heads of head_dim 32, q/k norms, every layer sparse:
             4 experts, top-2, expert width 32, norm_topk_prob true.
  qwen35     4 layers: Gated DeltaNet, full attention, Gated DeltaNet, full attention (two KV
             layers, and `layer_types` that `full_attention_interval` cannot express: the
             converter writes the interval 4 anyway and the layer list beside it, which the
             reader must prefer).
             Full attention: 4 query / 2 KV heads of head_dim 32, output gate, partial rotary
             0.25 (8 of 32 dims), mrope sections [2, 1, 1] (text: 1-D positions).
             Linear: 2 key heads of dim 16, 4 value heads of dim 24 (so V heads are reordered
             in GGUF and key and value widths differ), conv kernel 4. Dense MLP width 96.
  qwen35moe  4 layers, full attention in layer 3 as in the real models, with a sparse MLP:
             4 experts, top-2, expert width 32, a shared expert of width 48 with its gate.
Every parameter is re-initialised (seeded): matrices normal(0, 0.1); Qwen3.5's zero-centred
norms normal(0, 0.2) (they scale by 1 + w); other norms 1 + normal(0, 0.2); A_log
log(uniform(0.5, 4)); dt_bias normal(0, 0.5); the conv kernel normal(0, 0.3).

The converter needs a tokenizer; these models have a made-up 128-token vocabulary, so the
converter's `set_vocab` is replaced (in-process) by one writing a minimal byte-level vocabulary
(ids 0..126 = bytes 0x00..0x7e in GPT-2 byte-to-unicode form, id 127 = "ĠĠ"), as
gen_model_refs.py's hand-written GGUFs have. Everything else (tensor names, the A_log -> -exp,
norm +1 folding, V head reordering, metadata keys) is the converter's own.

reference.json: {"sequences": 3 seeded id lists (lengths 5, 23, 150), "logits_f32":
[seq][pos][128] from the transformers model run in float64 on the saved f32 weights (eval, no
cache, whole sequence in one forward; the name says which weights),
"transformers_f32_error": [seq][pos] the relative L2 distance of transformers' own
float32 forward from those logits (the positions where f32 arithmetic itself strays), "decode":
{"prefix_len": 17, "logits": [pos][128]} for sequence 2's positions 17..29 computed
step by step with transformers' cache (its recurrent decode path), "arch", versions}. Floats
are rounded to 7 significant digits.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

REPO = Path(__file__).resolve().parent.parent
TINY = REPO / "models" / "tests" / "fixtures" / "tiny"
SEQ_LENS = [5, 23, 150]
DECODE_PREFIX = 17
DECODE_STEPS = 12
VOCAB = 128

COMMON = dict(
    hidden_size=64,
    vocab_size=VOCAB,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=True,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)

def hybrid(layers, interval):
    return dict(
        num_hidden_layers=layers,
        layer_types=["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)],
        **HYBRID,
    )


HYBRID = dict(
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=24,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
)

ARCHS = {
    "qwen3moe": dict(
        config="Qwen3MoeConfig",
        model="Qwen3MoeForCausalLM",
        seed=2001,
        # See well_conditioned_sequences: the dense-attention MoE is as well conditioned as a
        # dense model away from router near ties.
        conditioning_limit=2e-5,
        kwargs=dict(
            num_hidden_layers=2,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    ),
    "qwen35": dict(
        config="Qwen3_5TextConfig",
        model="Qwen3_5ForCausalLM",
        seed=2002,
        # The recurrence itself amplifies a nudge 600-3000-fold on these random weights (every
        # draw of 50 moved by 6e-5 to 5e-4), so the limit only excludes the worst draws.
        conditioning_limit=1e-4,
        kwargs=dict(intermediate_size=96, **hybrid(4, 2)),
    ),
    "qwen35moe": dict(
        config="Qwen3_5MoeTextConfig",
        model="Qwen3_5MoeForCausalLM",
        seed=2003,
        conditioning_limit=1e-4,
        kwargs=dict(
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            num_experts=4,
            num_experts_per_tok=2,
            **hybrid(4, 4),
        ),
    ),
}


def r7(x):
    return float(f"{x:.7g}")


def round_logits(t):
    return [[r7(v) for v in row] for row in t.tolist()]


def write_json(path, obj):
    path.write_text(json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n")


def versions():
    return {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}


# Small enough that activations stay O(1) through the layers (with 0.2 the random hybrid model
# amplified a 1e-6 nudge of its weights 1000-fold), large enough that no layer is negligible.
MATRIX_STD = 0.1


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    zero_centred = "qwen35" in type(model).__name__.lower().replace("_", "")
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(0.5, 4.0, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            elif "norm" in name and p.dim() == 1:
                # Qwen3.5's gated norm (linear_attn.norm) scales by w; its other norms by 1 + w.
                centred = zero_centred and not name.endswith("linear_attn.norm.weight")
                base = 0.0 if centred else 1.0
                p.copy_(base + torch.randn(p.shape, generator=g) * 0.2)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * MATRIX_STD)


def build_model(arch):
    spec = ARCHS[arch]
    cfg_cls = getattr(transformers, spec["config"])
    model_cls = getattr(transformers, spec["model"])
    cfg = cfg_cls(**COMMON, **spec["kwargs"])
    torch.manual_seed(spec["seed"])
    model = model_cls(cfg).eval().to(torch.float32)
    init_weights(model, spec["seed"])
    return cfg, model


def sequences(seed):
    g = torch.Generator().manual_seed(seed)
    # ids 3.. so no sequence holds bos/eos by chance; the model does not care.
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in SEQ_LENS]


@torch.no_grad()
def full_logits(model, ids):
    out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].double()


@torch.no_grad()
def decode_logits(model, ids):
    """Prefill DECODE_PREFIX tokens, then feed one token at a time through the cache."""
    cache = transformers.DynamicCache(config=model.config)
    out = model(input_ids=torch.tensor([ids[:DECODE_PREFIX]]), cache=cache, use_cache=True)
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    rows = [out.logits[0, -1].double()]
    for t in ids[DECODE_PREFIX : DECODE_PREFIX + DECODE_STEPS - 1]:
        out = model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        rows.append(out.logits[0, -1].double())
    return torch.stack(rows)


def rel_l2(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


CONVERTER_STUB = r'''
import sys, types
from pathlib import Path
llama_src = Path(sys.argv.pop(1))
sys.path.insert(0, str(llama_src))
sys.path.insert(1, str(llama_src / "gguf-py"))
import gguf
import conversion
from conversion import base as conversion_base

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}

def set_vocab(self):
    b2u = bytes_to_unicode()
    vocab = self.hparams["vocab_size"]
    w = self.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([b2u[b] for b in range(vocab - 1)] + [b2u[0x20] * 2])
    w.add_token_types([int(gguf.TokenType.NORMAL)] * vocab)
    w.add_token_merges([f"{b2u[0x20]} {b2u[0x20]}"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)

# Model modules load lazily, so patch the base class's vocabulary writers that every text
# model's `set_vocab` ends in.
for attr in dir(conversion_base.TextModel):
    if attr == "set_vocab" or attr.startswith("_set_vocab_"):
        setattr(conversion_base.TextModel, attr, set_vocab)
sys.argv[0] = str(llama_src / "convert_hf_to_gguf.py")
import runpy
runpy.run_path(str(llama_src / "convert_hf_to_gguf.py"), run_name="__main__")
'''


def convert(llama_src, hf_dir, out, outtype):
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(CONVERTER_STUB)
        stub = f.name
    try:
        cmd = [sys.executable, stub, str(llama_src), str(hf_dir), "--outtype", outtype, "--outfile", str(out)]
        if "qwen35" in out.parent.name:
            cmd.append("--no-mtp")
        env = dict(os.environ, NO_LOCAL_GGUF="")
        env.pop("NO_LOCAL_GGUF")
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    finally:
        os.unlink(stub)


def check_gguf(path, arch):
    sys.path.insert(0, str(ARGS.llama_src / "gguf-py"))
    import gguf  # noqa: E402  (llama.cpp's own gguf-py, which knows the qwen35 keys)

    reader = gguf.GGUFReader(str(path))
    arch_field = reader.fields["general.architecture"]
    got = bytes(arch_field.parts[arch_field.data[0]]).decode()
    assert got == arch, f"{path}: general.architecture {got}, expected {arch}"
    names = [t.name for t in reader.tensors]
    print(f"  {path.name}: {len(names)} tensors, e.g. {', '.join(n for n in names if n.startswith('blk.0.'))}")


# GGUF matrix name (within blk.N) -> transformers module (within model.layers.N), and how
# llama.cpp's converter reorders its value heads: "rows"/"cols" with the head width, or None.
GGUF_TO_HF = {
    "attn_qkv": ("linear_attn.in_proj_qkv", "qkv"),
    "attn_gate": ("linear_attn.in_proj_z", ("rows", "v")),
    "ssm_alpha": ("linear_attn.in_proj_a", ("rows", 1)),
    "ssm_beta": ("linear_attn.in_proj_b", ("rows", 1)),
    "ssm_out": ("linear_attn.out_proj", ("cols", "v")),
    "attn_q": ("self_attn.q_proj", None),
    "attn_k": ("self_attn.k_proj", None),
    "attn_v": ("self_attn.v_proj", None),
    "attn_output": ("self_attn.o_proj", None),
    "ffn_gate": ("mlp.gate_proj", None),
    "ffn_up": ("mlp.up_proj", None),
    "ffn_down": ("mlp.down_proj", None),
    "ffn_gate_inp": ("mlp.gate", None),
    "ffn_gate_inp_shexp": ("mlp.shared_expert_gate", None),
    "ffn_gate_shexp": ("mlp.shared_expert.gate_proj", None),
    "ffn_up_shexp": ("mlp.shared_expert.up_proj", None),
    "ffn_down_shexp": ("mlp.shared_expert.down_proj", None),
    "ffn_gate_exps": ("mlp.experts.{e}.gate_proj", None),
    "ffn_up_exps": ("mlp.experts.{e}.up_proj", None),
    "ffn_down_exps": ("mlp.experts.{e}.down_proj", None),
}


def dequantized_state_dict(cfg, q8_path, state):
    """`state` (transformers' f32 weights) with every matrix that the Q8_0 file stores quantized
    replaced by the file's dequantized values, mapped back through the converter's renaming and
    value-head reordering (its other transformations touch only tensors it keeps in F32)."""
    sys.path.insert(0, str(ARGS.llama_src / "gguf-py"))
    import gguf  # noqa: E402
    from gguf.quants import dequantize  # noqa: E402

    nk = getattr(cfg, "linear_num_key_heads", 1)
    nv = getattr(cfg, "linear_num_value_heads", 1)
    dv = getattr(cfg, "linear_value_head_dim", 1)
    r = nv // nk

    def unreorder(t, dim, width):
        # The converter's [nk, r, width] -> [r, nk, width] along `dim`, undone.
        t = t.movedim(dim, 0)
        rest = t.shape[1:]
        t = t.reshape(r, nk, width, *rest).permute(1, 0, 2, *range(3, 3 + len(rest))).reshape(-1, *rest)
        return t.movedim(0, dim)

    state = dict(state)
    replaced = 0
    for t in gguf.GGUFReader(str(q8_path)).tensors:
        # The converter falls back to F16 for matrices whose rows are no whole number of Q8_0
        # blocks (the shared expert's down projection, 48 wide).
        if t.tensor_type not in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16):
            continue
        values = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
        if t.name == "token_embd.weight":
            # Tied: the head is the same parameter, and load_state_dict would otherwise write
            # the f32 head over the embedding.
            state["model.embed_tokens.weight"] = values
            if "lm_head.weight" in state:
                state["lm_head.weight"] = values
            replaced += 1
            continue
        _, layer, kind, _ = t.name.split(".")
        hf, order = GGUF_TO_HF[kind]
        prefix = f"model.layers.{layer}."
        if "{e}" in hf:
            # In memory transformers fuses the experts: gate_up_proj [E, 2I, H] (gate rows
            # first), down_proj [E, H, I].
            if kind == "ffn_down_exps":
                fused, rows = prefix + "mlp.experts.down_proj", slice(None)
            else:
                fused = prefix + "mlp.experts.gate_up_proj"
                inner = values.shape[1]
                rows = slice(0, inner) if kind == "ffn_gate_exps" else slice(inner, 2 * inner)
            target = state[fused].clone()
            assert target[:, rows].shape == values.shape, (t.name, target.shape, values.shape)
            target[:, rows] = values
            state[fused] = target
            replaced += 1
            continue
        if nk != nv and order == "qkv":
            qk = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
            values = torch.cat([values[:qk], unreorder(values[qk:], 0, dv)])
        elif nk != nv and order is not None:
            axis, width = order
            values = unreorder(values, 0 if axis == "rows" else 1, dv if width == "v" else width)
        name = prefix + hf + ".weight"
        assert state[name].shape == values.shape, (name, state[name].shape, values.shape)
        state[name] = values
        replaced += 1
    print(f"  {replaced} matrices replaced by their Q8_0 (or F16) values")
    return state


def perturbed(model, seed, scale=1e-7):
    """A copy of a float64 model with every weight multiplied by 1 + scale * N(0, 1): f32
    rounding (a relative 6e-8) of the weights, simulated."""
    import copy

    g = torch.Generator().manual_seed(seed)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for _, p in sorted(other.named_parameters()):
            p.mul_(1 + scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return other


def well_conditioned_sequences(arch, exact_models):
    """Seeded sequences on which every float64 model's logits move by at most the arch's
    `conditioning_limit` when its weights move by 1e-7 (relative). A MoE router's near tie (two experts' probabilities equal
    to f32 precision) makes a position's logits jump with rounding, and the recurrent state
    carries that into later positions; such a sequence tests rounding luck, not the
    implementation."""
    limit = ARCHS[arch]["conditioning_limit"]
    nudged = [perturbed(m, 7) for m in exact_models]
    for attempt in range(50):
        seqs = sequences(ARCHS[arch]["seed"] + 7 + 1000 * attempt)
        worst = 0.0
        for m, n in zip(exact_models, nudged):
            for ids in seqs:
                for a, b in zip(full_logits(n, ids), full_logits(m, ids)):
                    worst = max(worst, rel_l2(a, b))
        if worst <= limit:
            print(f"  sequences of draw {attempt}: a 1e-7 nudge of the weights moves logits by {worst:.1e}")
            return seqs
        print(f"  draw {attempt}: a 1e-7 nudge of the weights moves logits by {worst:.1e}: redrawn")
    raise SystemExit(f"{arch}: no well-conditioned draw of sequences in 50 tries")


def generate(arch):
    cfg, model = build_model(arch)
    folder = TINY / arch
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    model.save_pretrained(folder, safe_serialization=True)
    for extra in ("generation_config.json",):
        (folder / extra).unlink(missing_ok=True)
    for outtype, name in (("f32", "model-f32.gguf"), ("q8_0", "model-q8_0.gguf")):
        convert(ARGS.llama_src, folder, folder / name, outtype)
        check_gguf(folder / name, arch)
    # Reload what was saved, so the reference is the saved checkpoint's, and compute it in
    # float64: the implementation under test runs in f32, so the reference should be exact.
    model_cls = getattr(transformers, ARCHS[arch]["model"])
    reloaded = model_cls.from_pretrained(folder, dtype=torch.float32).eval()
    exact = model_cls.from_pretrained(folder, dtype=torch.float64, experts_implementation="eager").eval()
    probe = [torch.randint(3, VOCAB, (9,)).tolist()]
    for ids in probe:
        assert rel_l2(full_logits(reloaded, ids), full_logits(model, ids)) < 1e-6, "save_pretrained changed the model"
    q8_state = dequantized_state_dict(cfg, folder / "model-q8_0.gguf", reloaded.state_dict())
    q8_exact = model_cls.from_pretrained(folder, dtype=torch.float64, experts_implementation="eager").eval()
    q8_exact.load_state_dict({k: v.double() for k, v in q8_state.items()})
    seqs = well_conditioned_sequences(arch, [exact, q8_exact])
    logits = [full_logits(exact, s) for s in seqs]
    logits_q8 = [full_logits(q8_exact, s) for s in seqs]
    decode = decode_logits(exact, seqs[2])
    want = logits[2][DECODE_PREFIX - 1 : DECODE_PREFIX - 1 + DECODE_STEPS]
    err = rel_l2(decode, want)
    print(f"  transformers cached decode vs full forward: rel L2 {err:.2e}")
    assert err < 1e-4
    write_json(
        folder / "reference.json",
        {
            "arch": arch,
            "sequences": seqs,
            "logits_f32": [round_logits(t) for t in logits],
            "logits_q8_0": [round_logits(t) for t in logits_q8],
            "decode": {"prefix_len": DECODE_PREFIX, "logits": round_logits(decode)},
            **versions(),
        },
    )
    print(f"{arch}: wrote {folder}")


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-src", type=Path, required=True, help="llama.cpp source (has convert_hf_to_gguf.py)")
    ap.add_argument("--only", choices=sorted(ARCHS), action="append")
    ARGS = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for arch in ARGS.only or sorted(ARCHS):
        generate(arch)


if __name__ == "__main__":
    main()
