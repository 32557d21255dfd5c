"""Hugging Face tensor names and layouts <-> the engine's (models/llama/model.py), one layer at a time.

    model.embed_tokens.weight                  0.word
    model.layers.{i}.input_layernorm.weight    {i+1}.norm_attn.weight
    model.layers.{i}.self_attn.q_proj.*        {i+1}.attn_q.*
    model.layers.{i}.self_attn.{k,v}_proj.*    {i+1}.attn_kv.*   (interleaved per kv head: k of head 0, v of head 0,
                                                                  k of head 1, ...: a contiguous slice holds whole
                                                                  heads, so tensor parallelism splits it as it is)
    model.layers.{i}.self_attn.o_proj.weight   {i+1}.attn_out.weight
    model.layers.{i}.post_attention_layernorm  {i+1}.norm_mlp.weight
    model.layers.{i}.mlp.{gate,up,down}_proj   {i+1}.mlp_{gate,up,down}.weight
    model.norm.weight                          {L+1}.norm.weight
    lm_head.weight                             {L+1}.lm_head.weight  (tied: a copy of the token embedding, which
                                                                      the HF file then does not hold)

q and k keep HF's feature order (its "rotate half" RoPE is the engine's), so nothing is permuted; the conversion
moves and interleaves rows, bit for bit, in the tensors' own dtype.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import torch

from hybrid_engine.checkpoint.files import DTYPES
from hybrid_engine.models.llama.config import LlamaConfig

from .hf_config import HFError

LAYER = "model.layers.{}."
PLAIN = {"input_layernorm.weight": "norm_attn.weight", "self_attn.q_proj.weight": "attn_q.weight",
         "self_attn.o_proj.weight": "attn_out.weight", "post_attention_layernorm.weight": "norm_mlp.weight",
         "mlp.gate_proj.weight": "mlp_gate.weight", "mlp.up_proj.weight": "mlp_up.weight",
         "mlp.down_proj.weight": "mlp_down.weight"}
DERIVED = ("rotary_emb.inv_freq",)  # buffers some older files hold: recomputed from the config, never read


def hf_names(cfg: LlamaConfig) -> list[str]:
    """Every tensor name an HF file of this model holds."""
    kinds = ("weight", "bias") if cfg.qkv_bias else ("weight",)
    per_layer = list(PLAIN) + [f"self_attn.{p}_proj.{kind}" for p in "kv" for kind in kinds]
    per_layer += ["self_attn.q_proj.bias"] if cfg.qkv_bias else []
    names = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if cfg.tie_embeddings else ["lm_head.weight"])
    return names + [LAYER.format(i) + n for i in range(cfg.layers) for n in per_layer]


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    h, d, f, v = cfg.hidden, cfg.head_dim, cfg.ffn_hidden, cfg.vocab_size
    per_layer = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
                 "self_attn.q_proj.weight": (cfg.heads * d, h), "self_attn.k_proj.weight": (cfg.kv_heads * d, h),
                 "self_attn.v_proj.weight": (cfg.kv_heads * d, h), "self_attn.o_proj.weight": (h, cfg.heads * d),
                 "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h), "mlp.down_proj.weight": (h, f),
                 "self_attn.q_proj.bias": (cfg.heads * d,), "self_attn.k_proj.bias": (cfg.kv_heads * d,),
                 "self_attn.v_proj.bias": (cfg.kv_heads * d,)}
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    shapes |= {LAYER.format(i) + n: s for i in range(cfg.layers) for n, s in per_layer.items()}
    return {n: shapes[n] for n in hf_names(cfg)}


def check_names(cfg: LlamaConfig, held: Iterable[str], where: str) -> None:
    """The files must hold every tensor of the model and nothing else (but derived buffers, and an untied-looking
    lm_head.weight beside tied embeddings, which must then equal the embedding: checked when read)."""
    held = set(held)
    wanted = set(hf_names(cfg))
    missing = sorted(wanted - held)
    if missing:
        raise HFError(f"{where}: tensor {missing[0]} is missing")
    extra = sorted(n for n in held - wanted if not n.endswith(DERIVED)
                   and not (cfg.tie_embeddings and n == "lm_head.weight"))
    if extra:
        raise HFError(f"{where}: tensor {extra[0]} is not part of a {cfg.layers}-layer Llama of this config")


def _interleave(k: torch.Tensor, v: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """k, v [kv_heads d, ...] -> [kv_heads 2 d, ...] in (head, {k, v}, d) order."""
    return torch.stack([k.reshape(kv_heads, -1, *k.shape[1:]), v.reshape(kv_heads, -1, *v.shape[1:])], dim=1).reshape(
        2 * k.shape[0], *k.shape[1:])


def _split(kv: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = kv.reshape(kv_heads, 2, -1, *kv.shape[1:])
    return (pairs[:, 0].reshape(kv.shape[0] // 2, *kv.shape[1:]).contiguous(),
            pairs[:, 1].reshape(kv.shape[0] // 2, *kv.shape[1:]).contiguous())


def to_engine(cfg: LlamaConfig, get: Callable[[str], torch.Tensor],
              held: Iterable[str] = ()) -> Iterator[dict[str, torch.Tensor]]:
    """The engine's tensors, one module (a checkpoint shard) at a time: get(hf name) reads one tensor. held: the
    names the files hold (a tied model's file holding lm_head.weight too: it must equal the embedding)."""
    shapes = expected_shapes(cfg)

    def read(name: str) -> torch.Tensor:
        t = get(name)
        if tuple(t.shape) != shapes[name] or str(t.dtype).replace("torch.", "") not in DTYPES:
            raise HFError(f"tensor {name} is {list(t.shape)} {t.dtype}; this config needs {list(shapes[name])} "
                          f"of {', '.join(DTYPES)}")
        if not torch.isfinite(t).all():
            raise HFError(f"tensor {name} holds NaN or infinite values: training or sampling it gives NaN; "
                          "a damaged or diverged model")
        return t

    word = read("model.embed_tokens.weight")
    yield {"0.word": word}
    for i in range(cfg.layers):
        layer = LAYER.format(i)
        out = {f"{i + 1}.{ours}": read(layer + theirs) for theirs, ours in PLAIN.items()}
        for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
            out[f"{i + 1}.attn_kv.{kind}"] = _interleave(read(f"{layer}self_attn.k_proj.{kind}"),
                                                          read(f"{layer}self_attn.v_proj.{kind}"), cfg.kv_heads)
        if cfg.qkv_bias:
            out[f"{i + 1}.attn_q.bias"] = read(f"{layer}self_attn.q_proj.bias")
        yield out
    head = f"{cfg.layers + 1}."
    if cfg.tie_embeddings:
        if "lm_head.weight" in set(held) and not torch.equal(get("lm_head.weight"), word):
            raise HFError("tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight")
        lm_head = word
    else:
        lm_head = read("lm_head.weight")
    yield {head + "norm.weight": read("model.norm.weight"), head + "lm_head.weight": lm_head}


def to_hf(cfg: LlamaConfig, weights: Iterable[tuple[str, torch.Tensor]],
          dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of the engine's (global name, full tensor) pairs, cast to `dtype` (None: as they are);
    a tied model's LM head is left out (HF files hold the embedding once)."""
    theirs = {ours: theirs for theirs, ours in PLAIN.items()}
    last = cfg.layers + 1
    for name, tensor in weights:
        cast = tensor if dtype is None else tensor.to(dtype)
        if cast.device.type != "meta" and not torch.isfinite(cast).all():
            if torch.isfinite(tensor).all():
                raise HFError(f"{name} holds values beyond {cast.dtype}'s range (largest magnitude "
                              f"{tensor.abs().max().item():.4g}): they would be written as infinite; choose a wider "
                              "--dtype")
            raise HFError(f"{name} holds NaN or infinite values: a damaged or diverged checkpoint")
        tensor = cast
        index, _, leaf = name.partition(".")
        i = int(index)
        if i == 0 and leaf == "word":
            yield "model.embed_tokens.weight", tensor
        elif i == last:
            if leaf == "norm.weight":
                yield "model.norm.weight", tensor
            elif not cfg.tie_embeddings:
                yield "lm_head.weight", tensor
        elif leaf.startswith("attn_kv."):
            kind = leaf.partition(".")[2]
            k, v = _split(tensor, cfg.kv_heads)
            yield f"{LAYER.format(i - 1)}self_attn.k_proj.{kind}", k
            yield f"{LAYER.format(i - 1)}self_attn.v_proj.{kind}", v
        elif leaf == "attn_q.bias":
            yield f"{LAYER.format(i - 1)}self_attn.q_proj.bias", tensor
        else:
            yield LAYER.format(i - 1) + theirs[leaf], tensor


def check_engine_shapes(cfg: LlamaConfig, shapes: dict[str, list[int]], where: str) -> None:
    """The tensors a checkpoint's manifest lists ({engine name: shape}) are those of the model its model entry
    describes (`cfg`): mapped through to_hf on meta tensors (nothing read), they are hf_names(cfg) of
    expected_shapes(cfg). An edited entry (another vocabulary, a layer count) is refused before any export."""
    try:
        got = {n: tuple(t.shape) for n, t in to_hf(cfg, ((k, torch.empty(v, device="meta"))
                                                         for k, v in shapes.items()))}
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as exc:
        raise HFError(f"{where}: its tensors are not those of the Llama its manifest describes (at "
                      f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    want = expected_shapes(cfg)
    odd = next((n for n in list(want) + list(got) if got.get(n) != want.get(n)), None)
    if odd is not None:
        theirs = "no such tensor" if odd not in got else list(got[odd])
        raise HFError(f"{where}: its manifest describes a Llama (vocabulary {cfg.vocab_size}, {cfg.layers} layers, "
                      f"hidden {cfg.hidden}) whose {odd} is {list(want[odd]) if odd in want else 'absent'}, but its "
                      f"tensors give {theirs}: an edited or damaged manifest")
