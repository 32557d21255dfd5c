"""Capturing the stages' CUDA graphs runs out of memory (train/graph_fallback.py): a one-process run whose graphs
auto chose drops them (Engine.run_eagerly), says so in one line and runs the step again eagerly; under --cuda-graphs
on, across processes, or where the step had begun its actions, the error stands. The host's replay records a
capture without running it, so the out-of-memory error itself is not raised inside a capture here: the decision is
checked on the executor's activity, the dropping on an engine that trains on after it."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from decoder_graph_runs import one_rank_llama  # noqa: E402
from dist_utils import run_ranks  # noqa: E402
from hybrid_engine.parallel.pipeline.graphs import GraphChoice  # noqa: E402
from hybrid_engine.train.graph_fallback import capture_ran_out, step_or_run_eagerly  # noqa: E402

STEPS = 4


def train(rank: int, world: int, graphs: str) -> dict:
    """The Llama on one rank, 2 micro-batches a step: eagerly ("off"), or graphed by the host's replay for its
    first two steps (warm-up, then capture and replay) and then without its graphs (Engine.run_eagerly, what the
    fallback calls), "dropped"."""
    torch.set_num_threads(1)
    workload, groups, engine = one_rank_llama(rank, "host" if graphs == "dropped" else "off")
    losses, captures, said = [], [], []
    for at in range(STEPS):
        if graphs == "dropped" and at == 2:
            [program] = engine.stage_programs.values()
            captures.append(program.captures)
            said.append(engine.run_eagerly("auto: test").describe())
        x, y = workload.draw(at, 0, 8)
        losses.append(engine.train_step(x, y).loss)
    out = {"losses": losses, "said": said, "captures": captures, "graphs": engine.cuda_graphs.on,
           "kinds": sorted({type(p).__name__ for p in engine.stage_programs.values()}),
           "state": {k: t.numpy() for k, t in engine.full_state_dict().items()}}
    engine.close()
    groups.destroy()
    return out


def test_an_engine_that_drops_its_graphs_trains_on_eagerly_as_an_eager_engine():
    [dropped], [eager] = (run_ranks(1, train, graphs, timeout=120) for graphs in ("dropped", "off"))
    assert dropped["captures"] == [2] and dropped["said"] == ["CUDA graphs off (auto: test)"]
    assert not dropped["graphs"] and dropped["kinds"] == eager["kinds"]
    assert dropped["losses"] == eager["losses"]
    for name, value in eager["state"].items():
        np.testing.assert_array_equal(dropped["state"][name], value, err_msg=name)


class _Engine:
    def __init__(self, on: bool, activity: dict | None):
        self.cuda_graphs, self._activity = GraphChoice(on, "test"), activity

    def activity(self):
        return self._activity


AT_START = {"in_step": True, "action": None}


@pytest.mark.parametrize("engine, mode, world, fell_back", [
    (_Engine(True, AT_START), "auto", 1, True),
    (_Engine(True, AT_START), "on", 1, False),  # on asks for graphs: the error stands
    (_Engine(True, AT_START), "auto", 2, False),  # every rank would first have to learn of it
    (_Engine(False, AT_START), "auto", 1, False),  # no graphs: an eager step's own shortage
    (_Engine(True, {"in_step": True, "action": "F0"}), "auto", 1, False),  # the step had begun: not a capture
    (_Engine(True, None), "auto", 1, False),
])
def test_only_a_capture_that_auto_chose_on_one_process_falls_back(engine, mode, world, fell_back):
    assert capture_ran_out(engine, mode, world) == fell_back
    calls = []

    def step(at):
        calls.append(at)
        if len(calls) == 1:
            raise torch.OutOfMemoryError("out of memory")
        return "stepped"

    engine.run_eagerly = lambda why: GraphChoice(False, why)
    if fell_back:
        said = []
        assert step_or_run_eagerly(step, 3, engine, mode, world, said.append) == "stepped" and calls == [3, 3]
        assert said and "step 3" in said[0]
    else:
        with pytest.raises(torch.OutOfMemoryError):
            step_or_run_eagerly(step, 3, engine, mode, world, print)
