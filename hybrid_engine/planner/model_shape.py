"""A model as the planner sees it: per layer (a module of the engine's Sequential, or an MLP block), its
parameters, its FLOPs and the bytes it keeps, from the run's model options alone (nothing is built).

Activation counts are per token (a sample of the MLP is one token), in elements of the activation dtype; the
decoders' follow Megatron's accounting (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models": 34 s h bytes per layer at half precision with a fused attention core, i.e. 17 h elements),
of which the part before and after the MP region (LayerNorms, residual: 5 h elements) stays whole on every MP rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class LayerShape:
    """One layer: parameters (all, and those that are GEMM weights) and what one token costs and keeps."""

    params: int
    matmul_params: int
    attention_flops: float = 0.0
    """Forward FLOPs of the attention core per token (scores and weighted sum)."""
    act_split: float = 0.0
    """Activation elements per token kept for the backward, split over MP."""
    act_whole: float = 0.0
    """Activation elements per token kept for the backward, whole on every MP rank."""
    stash: float = 0.0
    """Elements per token a merged weight gradient keeps until the step's end (the GEMMs' inputs and output
    gradients), split over MP."""
    mp_allreduces: float = 0.0
    """MP all-reduces of one token's hidden vector per forward (as many in the backward)."""
    loss_bytes: float = 0.0
    """Bytes per token of one micro-batch the loss keeps (the logits and their fp32 softmax), split over MP."""


@dataclass(frozen=True)
class ModelShape:
    """The planner's view of a model: layers in order, the per-token width sent between stages, the data's
    bytes per sample, and how the engine cuts it into stages."""

    name: str
    layers: tuple[LayerShape, ...]
    hidden: int
    tokens_per_sample: int
    data_bytes: float
    """Bytes per sample of the data a step keeps (inputs on the first stage, targets on the last, each half)."""
    flops_per_sample: float
    native: bool = False
    """Stages run as the C++ native chain (the MLP); else through autograd, stage by stage in Python."""
    cut: Callable[[int], list[list[int]]] = field(repr=False, compare=False, default=None)

    @property
    def unit(self) -> str:
        return "tokens/s" if self.tokens_per_sample > 1 else "samples/s"


def mlp_shape(dim: int, depth: int) -> ModelShape:
    """The course MLP: one layer per Linear + ReLU block; the native chain keeps each layer's output; MP splits
    column-row pairs, one all-reduce per pair."""
    from hybrid_engine.parallel.pipeline.partition import stage_block_counts

    def cut(stages: int) -> list[list[int]]:
        out, start = [], 0
        for count in stage_block_counts(depth, stages):
            out.append(list(range(start, start + count)))
            start += count
        return out

    layer = LayerShape(params=dim * dim + dim, matmul_params=dim * dim, act_split=dim, stash=2 * dim,
                       mp_allreduces=0.5, loss_bytes=0.0)
    return ModelShape("mlp", (layer,) * depth, dim, 1, data_bytes=2 * dim, flops_per_sample=6.0 * dim * dim * depth,
                      native=True, cut=cut)


def decoder_shape(name: str, layers: int, hidden: int, seq_len: int, vocab: int, block_params: int,
                  ffn_hidden: int, tied: bool, costs: list[float], flops_per_token: float) -> ModelShape:
    """A decoder (the GPT or the Llama): embedding, blocks, head; stages cut by balanced_partition(costs)."""
    from hybrid_engine.parallel.pipeline.balance import balanced_partition

    h = hidden
    embedding = LayerShape(params=vocab * h + (seq_len * h if name == "gpt" else 0), matmul_params=0, act_whole=h)
    block = LayerShape(params=block_params, matmul_params=block_params, attention_flops=4.0 * seq_len * h,
                       act_split=12 * h, act_whole=5 * h, stash=8 * h + 2 * ffn_hidden,
                       mp_allreduces=2)
    head = LayerShape(params=0 if tied else vocab * h, matmul_params=vocab * h, act_whole=2 * h,
                      stash=h + vocab, loss_bytes=vocab * 10.0)
    return ModelShape(name, (embedding, *(block,) * layers, head), h, seq_len, data_bytes=16.0 * seq_len,
                      flops_per_sample=flops_per_token * seq_len, cut=lambda n: balanced_partition(costs, n))


def shape_of(cfg) -> ModelShape:
    """The shape of the run's model (cfg: RunConfig); a decoder's vocabulary is its data's (read from the data
    file's header), as the workload's will be."""
    m = cfg.model.options
    if cfg.model.name == "mlp":
        return mlp_shape(m.dim, m.depth)
    from hybrid_engine.models.token_workload import data_vocab

    if cfg.model.name == "gpt":
        from hybrid_engine.models.gpt.flops import gpt_flops_per_token
        from hybrid_engine.models.gpt.model import GPTConfig, layer_costs

        g = GPTConfig(data_vocab(cfg.data.path, m.seq_len), m.layers, m.hidden, m.heads, m.seq_len, m.tie_embeddings)
        return decoder_shape("gpt", g.layers, g.hidden, g.seq_len, g.vocab_size, 12 * g.hidden**2 + 13 * g.hidden,
                             4 * g.hidden, g.tie_embeddings, layer_costs(g), gpt_flops_per_token(g))
    from hybrid_engine.models.llama.flops import llama_flops_per_token, llama_matmul_params
    from hybrid_engine.models.llama.model import layer_costs as llama_costs
    from hybrid_engine.models.llama.workload import config_of_options

    vocab = m.vocab_size or data_vocab(cfg.data.path, m.seq_len)
    c = config_of_options(m, cfg.model.seed, vocab)
    block = (llama_matmul_params(c) - c.hidden - c.vocab_size * c.hidden) // c.layers
    return decoder_shape("llama", c.layers, c.hidden, c.seq_len, c.vocab_size, block, c.ffn_hidden,
                         c.tie_embeddings, llama_costs(c), llama_flops_per_token(c))
