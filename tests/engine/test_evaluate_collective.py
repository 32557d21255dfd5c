"""engine.evaluate is collective (docs/api.md): every rank of the grid calls it. Called on one rank only, it ends
with one line that says so and names what the peers did not answer, not the process group's C++ frames."""
import torch

from dist_utils import run_ranks
from engine_builders import make_engine
from hybrid_engine import ProcessGrid
from hybrid_engine.models import large_linear_model
from hybrid_engine.parallel.grid import build_groups


def evaluate_on_rank_0_only(rank: int, world: int) -> str | None:
    groups = build_groups(ProcessGrid(2, 1, 1), rank)
    engine = make_engine(large_linear_model(8, 2, 0), groups, micro_batches=1)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    if rank != 0:
        return None  # goes on without evaluating: its process group closes
    try:
        engine.evaluate(x, y)
    except RuntimeError as exc:
        return str(exc)
    return "evaluate returned"


def test_evaluate_on_one_rank_is_one_line_saying_it_is_collective():
    said, _ = run_ranks(2, evaluate_on_rank_0_only, timeout=90)
    assert said is not None and "\n" not in said, said
    assert said.startswith("engine.evaluate is collective: every rank of the grid calls it"), said
    assert "Exception raised from" not in said and "frame #" not in said
