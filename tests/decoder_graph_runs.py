"""The tiny GPT and Llama trained with their autograd stages CUDA-graphed and eager, the same steps on the same data,
for the graph tests: on gloo ranks with the graphs replayed by the host (tests/parallel/test_graphed_decoders.py),
and on GPUs with real CUDA graphs (tests/parallel/test_cuda_graphs_decoders_gpu.py, one process per GPU under
torchrun: `python -m torch.distributed.run --nproc_per_node=N tests/decoder_graph_runs.py OUT RUNS_JSON`).

A run is a dict: model ("gpt" | "llama"), dp, pp, mp, schedule, v (virtual stages), m (micro-batches), sp
(sequence parallelism), tied (tied embeddings), amp, zero, optimizer ("sgd" | "adamw"), graphs ("off", "on" or
"host": on with the host's replay)."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # the tests' helpers, and the repository's package under torchrun

from engine_builders import make_engine  # noqa: E402
from graph_jobs import train_each  # noqa: E402
from hybrid_engine import ProcessGrid  # noqa: E402
from hybrid_engine.models.gpt.model import GPTConfig  # noqa: E402
from hybrid_engine.models.gpt.workload import gpt_workload  # noqa: E402
from hybrid_engine.models.llama.workload import llama_workload  # noqa: E402
from hybrid_engine.optim import optimizers as optim  # noqa: E402
from hybrid_engine.parallel.grid import build_groups  # noqa: E402
from hybrid_engine.kernels.options import KernelOptions, resolve  # noqa: E402
from hybrid_engine.parallel.pipeline.graphs import GraphChoice  # noqa: E402

from kernel_models import VOCAB, config, dataset  # noqa: E402

BATCH, STEPS, LR = 8, 4, 0.05
# fp16: a scale that doubles after every clean step, so the loss multiplier changes between replays


def workload_of(run: dict, device: str = "cpu"):
    """The run's model; "fp8": its blocks' GEMMs in fp8 (tensor-wise, the weight cache on), as the driver resolves
    `--fp8 --fused-kernels off` on this device: the Triton casts on a GPU, emulated on the CPU, and no compiled
    regions (whose compilation would add minutes to the GPU job)."""
    kernels = resolve("off", True, "tensorwise", torch.device(device).type) if run.get("fp8") else KernelOptions()
    if run.get("model", "llama") == "gpt":
        return gpt_workload(GPTConfig(VOCAB, 4, 32, 4, 16, run.get("tied", False), seed=3), dataset(),
                            sequence_parallel=run.get("sp", False), kernels=kernels)
    return llama_workload(config(run.get("tied", False)), dataset(), sequence_parallel=run.get("sp", False),
                          vocab_from_data=False, kernels=kernels)


def train(rank: int, world: int, runs: list[dict], device: str = "cpu") -> list[dict]:
    torch.set_num_threads(1)
    return train_each(_train_one, rank, runs, device)


def _train_one(rank: int, run: dict, device: str) -> dict:
    """One run of the table on this rank: its losses, scales, DP launches, graph counts, actions and state."""
    dp, pp, mp = run.get("dp", 1), run.get("pp", 1), run.get("mp", 1)
    workload = workload_of(run, device)
    groups = build_groups(ProcessGrid(dp, pp, mp), rank)
    mode = {"host": "off"}.get(run["graphs"], run["graphs"])
    opt = optim.AdamW(LR * 0.1) if run.get("optimizer") == "adamw" else optim.SGD(LR, 0.9)
    engine = make_engine(workload.model, groups, loss=workload.loss, schedule=run.get("schedule", "1f1b"),
                         micro_batches=run.get("m", 4), virtual_stages=run.get("v", 1), optimizer=opt,
                         amp=run.get("amp", "off"), scale_window=1, zero=run.get("zero", 0), device=device,
                         cuda_graphs=mode,
                         **workload.engine_kwargs(pp * run.get("v", 1)))
    if run["graphs"] == "host":
        engine._programs = engine.graphed_programs(GraphChoice(True, "test"), host_rerun=True)
    per_dp, at = BATCH // dp, groups.coords.dp
    losses, scales, launches = [], [], []
    for step in range(STEPS):
        x, y = workload.draw(step, at * per_dp, (at + 1) * per_dp, inputs=engine.holds_first_stage,
                             targets=engine.holds_last_stage)
        if x is not None:
            x = x.to(device)
        if y is not None:
            y = y.to(device)
        result = engine.train_step(x, y)
        losses.append(result.loss)
        scales.append(result.loss_scale)
        # each DP bucket's reduction, and whether a final-gradient announcement started it during the backward
        launches.append(engine._dp_sync.last_step_launches() if dp > 1 else [])
    programs = engine.stage_programs.values()
    record = {"losses": losses, "scales": scales, "launches": launches, "graphs": engine.cuda_graphs.on,
              "kinds": sorted({type(p).__name__ for p in programs}),
              "counts": [(p.captures, p.replays, p.slots) for p in programs if hasattr(p, "slots")],
              "stashed": [p.stashed for p in programs if hasattr(p, "slots")],
              "slot_of_micro": {s: list(p.slot_of_micro) for s, p in engine.stage_programs.items()
                                if hasattr(p, "slots")},
              "actions": [(a.type.name, a.stage, a.micro) for a in engine.actions],
              "state": {k: t.float().cpu().numpy() for k, t in engine.full_state_dict().items()}}
    engine.close()
    # what `programs` (still held) kept after close: the engine frees their graphs, or destroying the MP groups
    # would wait on NCCL for graphs that captured their collectives to die
    record["slots_after_close"] = [p.slots for p in programs if hasattr(p, "slots")]
    groups.destroy()
    dist.barrier()
    return record


def one_rank_llama(rank: int, graphs: str):
    """(workload, groups, engine): the tiny Llama on one rank, 2 micro-batches a step, SGD; graphs "host": its
    stage graphed and replayed by the host, chosen as `auto` would say it."""
    workload = workload_of({})
    groups = build_groups(ProcessGrid(1, 1, 1), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, micro_batches=2, optimizer=optim.SGD(LR, 0.9),
                         cuda_graphs="off", **workload.engine_kwargs(1))
    if graphs == "host":
        engine.cuda_graphs = GraphChoice(True, "auto: test")
        engine._programs = engine.graphed_programs(engine.cuda_graphs, host_rerun=True)
    return workload, groups, engine


def train_changing_shapes(rank: int, world: int, graphs: str) -> dict:
    """The Llama on one rank, 2 micro-batches streamed a step, of these rows: two steps of 4 + 4, two of 2 + 2, three
    of 4 + 3 (a smaller last micro-batch). A new shape runs eagerly and is captured at the next step's start; the
    last micro-batch of 3 rows runs eagerly beside the 4-row graphs, which it never displaces."""
    workload, groups, engine = one_rank_llama(rank, graphs)
    losses, counts = [], []
    for step, rows in enumerate(((4, 4), (4, 4), (2, 2), (2, 2), (4, 3), (4, 3), (4, 3))):
        x, y = workload.draw(step, 0, sum(rows))

        def source(t):
            return lambda micro: t[sum(rows[:micro]):sum(rows[:micro + 1])]

        losses.append(engine.train_step(source(x), source(y)).loss)
        [program] = engine.stage_programs.values()
        counts.append((program.captures, program.replays) if graphs == "host" else None)
    out = {"losses": losses, "counts": counts,
           "state": {k: t.numpy() for k, t in engine.full_state_dict().items()}}
    engine.close()
    groups.destroy()
    return out


def train_rescheduled(rank: int, world: int, graphs: str) -> dict:
    """The Llama at pp2: two steps of 1F1B, then three of zb1 (the planner's switch in place), with the stages graphed
    and replayed by the host throughout where graphs == "host" (the choice held on, as a GPU's would be): the new
    schedule's I is captured afresh, not replayed from 1F1B's B graphs."""
    from hybrid_engine.config.engine import ScheduleConfig

    workload = workload_of({})
    groups = build_groups(ProcessGrid(1, 2, 1), rank)
    engine = make_engine(workload.model, groups, loss=workload.loss, micro_batches=4, optimizer=optim.SGD(LR, 0.9),
                         cuda_graphs="off", **workload.engine_kwargs(2))
    if graphs == "host":
        engine.graph_choice = lambda schedule, mode: GraphChoice(True, "auto: test")
        host_programs = engine.graphed_programs
        engine.graphed_programs = lambda choice: host_programs(choice, host_rerun=True)
        engine.cuda_graphs = GraphChoice(True, "auto: test")
        engine._programs = engine.graphed_programs(engine.cuda_graphs)
    losses, stashed = [], []
    for step in range(5):
        if step == 2:
            engine.reschedule(ScheduleConfig("zb1", 4, 1, 0, False))
        x, y = workload.draw(step, 0, BATCH, inputs=engine.holds_first_stage, targets=engine.holds_last_stage)
        losses.append(engine.train_step(x, y).loss)
        stashed.append([getattr(p, "stashed", None) for p in engine.stage_programs.values()])
    out = {"losses": losses, "stashed": stashed,
           "kinds": sorted({type(p).__name__ for p in engine.stage_programs.values()}),
           "state": {k: t.numpy() for k, t in engine.full_state_dict().items()}}
    engine.close()
    groups.destroy()
    return out


class Action:
    """A compute action of a run's result as graphs.slots reads it (type.name, stage)."""

    def __init__(self, kind: str, stage: int, micro: int):
        self.type, self.stage, self.micro = type("Kind", (), {"name": kind}), stage, micro


def compute_actions(result: dict) -> list[Action]:
    """The compute actions (F, B, I, W) of the rank's action list, in order."""
    return [Action(*a) for a in result["actions"] if a[0] in ("F", "B", "I", "W")]


if __name__ == "__main__":  # one rank of a GPU run under torchrun: OUT RUNS_JSON
    from graph_jobs import torchrun_rank

    torchrun_rank(train)
