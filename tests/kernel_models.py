"""The tiny Llama the kernels tests train (tests/kernels): its shape and data, and a one-process training loop of
a Llama stage (plain, or through the kernels pass) that the engine's grids are held against."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from hybrid_engine.data import MarkovChain, TokenDataset
from hybrid_engine.kernels.apply import apply_kernels, loss_for
from hybrid_engine.kernels.options import KernelOptions
from hybrid_engine.models import losses
from hybrid_engine.models.llama.config import LlamaConfig
from hybrid_engine.models.llama.parallelize import build_llama

VOCAB, SEQ, BATCH, MICRO, LR, MOMENTUM = 67, 16, 8, 4, 0.1, 0.9


def config(tied: bool = False, layers: int = 4) -> LlamaConfig:
    return LlamaConfig(VOCAB, layers, 32, 4, 2, 48, SEQ, tie_embeddings=tied, rope_theta=500.0, seed=3)


def dataset() -> TokenDataset:
    return TokenDataset(MarkovChain(5, vocab=VOCAB).sample(4096, 7), VOCAB, SEQ, seed=11)


def train_one_process(kernels: KernelOptions, steps: int, tied: bool = False, lr: float = LR,
                      momentum: float = MOMENTUM, layers: int = 4, micro: int = MICRO) -> list[float]:
    """The Llama on one process through the C++ layers and `kernels`' pass, SGD with momentum, each step's batch
    in `micro` micro-batches whose losses are divided by their count (what the engine does): the step losses."""
    cfg = config(tied, layers)
    model = apply_kernels(build_llama(cfg), kernels)
    params = list(model.parameters())
    if tied:  # one tensor for both copies, as the engine's summed gradients keep them
        model[-1].lm_head.weight = model[0].word
        params = list(model.parameters())
    loss_fn = losses.bind(loss_for(losses.VocabParallelCrossEntropy(VOCAB), kernels), SimpleNamespace(mp=None),
                          model)
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    data, out = dataset(), []
    for step in range(steps):
        x, y = data.batch(step, BATCH)
        opt.zero_grad()
        total = 0.0
        for xm, ym in zip(x.chunk(micro), y.chunk(micro)):
            loss = loss_fn(model(xm), ym) / micro
            loss.backward()
            total += loss.item()
        opt.step()
        out.append(total)
    return out
