"""An independent single-process reference: the course model trained by plain PyTorch (no engine code),
micro-batch gradient accumulation, the same seed-derived weights and data."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hybrid_engine.models import SyntheticRegression, large_linear_model


def first_loss(dim: int, depth: int, batch_size: int, seed: int = 0) -> float:
    """The course model's loss on step 0's whole batch, before any update: what every system reports first."""
    model = large_linear_model(dim, depth, seed, device="cpu")
    x, y = SyntheticRegression(dim, seed, "cpu").batch(0, batch_size)
    with torch.no_grad():
        return float(F.mse_loss(model(x), y))


def reference_run(dim: int, depth: int, batch_size: int, micro_batches: int, steps: int, lr: float,
                  optimizer: str = "sgd", seed: int = 0) -> tuple[list[float], dict[str, torch.Tensor]]:
    torch.manual_seed(1234)  # must not matter: every draw has its own generator
    model = large_linear_model(dim, depth, seed, device="cpu")
    data = SyntheticRegression(dim, seed, "cpu")
    opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.Adam)(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        x, y = data.batch(step, batch_size)
        opt.zero_grad()
        total = 0.0
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
            loss = F.mse_loss(model(xm), ym)
            (loss / micro_batches).backward()
            total += loss.item() / micro_batches
        opt.step()
        losses.append(total)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
