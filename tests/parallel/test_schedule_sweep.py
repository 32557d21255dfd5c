"""Every schedule x recomputation x stage implementation x mp trains like the single-process reference.

A fault trial found `--schedule zb1 --no-fuse --recompute` training with every gradient zero: torch's
non-reentrant checkpoint hands the recomputed backward detached copies of the saved parameters, and the deferred
weight gradients were written into those copies. This sweep holds every combination to the reference, losses and
weights.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dist_utils import run_ranks
from engine_builders import make_engine
from engine_reference import reference_run
from hybrid_engine import ProcessGrid
from hybrid_engine.parallel.grid import build_groups
from hybrid_engine.models import SyntheticRegression, large_linear_model

CFG = dict(dim=16, depth=4, batch_size=16, micro_batches=4, steps=3, lr=0.1)
SCHEDULES = [("gpipe", 1, False), ("1f1b", 1, False), ("interleaved", 2, False), ("zb1", 1, False),
             ("zb1", 1, True)]  # (schedule, virtual stages, merged W)
RUNS = [(s, v, merge, recompute, impl) for s, v, merge in SCHEDULES for recompute in (False, True)
        for impl in ("auto", "autograd")]


def sweep(rank: int, world: int, mp: int) -> list[dict]:
    out = []
    for schedule, v, merge, recompute, impl in RUNS:
        groups = build_groups(ProcessGrid(1, 2, mp), rank)
        engine = make_engine(large_linear_model(CFG["dim"], CFG["depth"], 0), groups, schedule=schedule,
                             virtual_stages=v, merge_weight_grads=merge, micro_batches=CFG["micro_batches"],
                             lr=CFG["lr"], recompute=recompute, stage_impl=impl)
        data = SyntheticRegression(CFG["dim"], 0, "cpu")
        losses = [engine.train_step(*data.batch(step, CFG["batch_size"])).loss for step in range(CFG["steps"])]
        state = {k: t.numpy() for k, t in engine.full_state_dict().items()}
        out.append({"losses": losses, "state": state if groups.coords.mp == 0 else {}})
        engine.close()
        groups.destroy()
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def reference():
    return reference_run(CFG["dim"], CFG["depth"], CFG["batch_size"], CFG["micro_batches"], CFG["steps"], CFG["lr"])


@pytest.mark.parametrize("mp", [1, 2])
def test_every_schedule_recompute_and_stage_impl_matches_the_reference(reference, mp):
    want_losses, want_state = reference
    initial = {k: v for k, v in large_linear_model(CFG["dim"], CFG["depth"], 0, device="cpu").state_dict().items()}
    results = run_ranks(2 * mp, sweep, mp, timeout=300)
    for index, run in enumerate(RUNS):
        state = {}
        for rank_runs in results:
            got = rank_runs[index]
            assert got["losses"] == pytest.approx(want_losses, rel=1e-5), run
            state.update(got["state"])
        assert state.keys() == want_state.keys(), run
        for key, want in want_state.items():
            value = torch.from_numpy(state[key])
            assert torch.allclose(value, want, rtol=1e-5, atol=1e-6), (run, key)
            assert not torch.equal(value, initial[key]), (run, key, "never updated")
