"""Mixed into Engine: another schedule of the same stages from the next step on (the planner's switch after it
refits its cost model, hybrid_engine/planner/refit.py), or the same stages without their CUDA graphs; every stage,
parameter, gradient buffer and optimizer state stays, and the executor is built again on the next step."""
from __future__ import annotations

import gc

import torch

from hybrid_engine.config.engine import ScheduleConfig
from hybrid_engine.models import losses
from hybrid_engine.parallel.pipeline.graphs import GraphChoice, graphed, resolve
from hybrid_engine.parallel.pipeline.schedule import make_schedule


class Reschedule:
    """Reads and sets the Engine's schedule, micro-batch count, actions, executor and CUDA-graph choice."""

    def reschedule(self, schedule: ScheduleConfig) -> None:
        """Run `schedule` from the next step on: one of the same stages only (virtual stages and placement)."""
        schedule.validate(self.pp_size)
        if (schedule.virtual_stages, schedule.placement) != (self.schedule.virtual_stages, self.placement):
            raise ValueError(f"reschedule keeps the stages: {schedule.virtual_stages} virtual stages placed "
                             f"{schedule.placement}, not {self.schedule.virtual_stages} placed {self.placement}")
        self.wait_for_parameters()  # no all-gather left writing into the parameters
        self.schedule, self.micro_batches = schedule, schedule.micro_batches
        self.actions = make_schedule(schedule.name, self.pp_size, schedule.micro_batches, schedule.virtual_stages,
                                     schedule.lookahead)[self.pp_rank]
        self._overwrite_grads = self.overwrites_grads(schedule)
        # Graphs where the new schedule allows them (never a refusal mid-run: `on` is held to as auto is).
        choice = self.graph_choice(schedule, "off" if self.stage_cfg.cuda_graphs == "off" else "auto")
        if choice.on != self.cuda_graphs.on and self.groups.rank == 0:
            print(f"schedule {schedule.name}: {choice.describe()}", flush=True)
        if self.cuda_graphs.on:
            # graphs are captured afresh for a new schedule: its micro-batches in flight, and whether each backward
            # is a B or an I (zero-bubble), decide what a slot of an autograd stage's graphs holds
            self.drop_graphs()
        self._programs = self.graphed_programs(choice)
        self.cuda_graphs = choice
        self._executor = None

    def drop_graphs(self) -> None:
        """Free the stages' CUDA graphs and the executor; the stages run their eager programs from the next step.
        NCCL destroys no communicator while a graph that captured its collectives lives, and a caller may still
        hold the programs (stage_programs): the graphs go here, not with the last reference."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # no replay still queued when its graphs go
        for program in self._programs.values():
            program.release()
        self._executor = None
        self._programs = dict(self._eager_programs)

    def run_eagerly(self, why: str) -> GraphChoice:
        """Drop the stages' CUDA graphs, their pools back to the device, and run every stage eagerly from the next
        step (train/graph_fallback.py: capturing them ran out of memory). Returns the new choice, which says why."""
        self.drop_graphs()
        self.cuda_graphs = GraphChoice(False, why)
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return self.cuda_graphs

    def graph_choice(self, schedule: ScheduleConfig, mode: str) -> GraphChoice:
        """Whether this engine's stages run CUDA-graphed under `schedule` (parallel/pipeline/graphs.py)."""
        return resolve(mode, self.device.type, [p.native for p in self.plans], schedule, self.pp_size,
                       self.stage_cfg, self.data_parallel, losses.is_builtin(self.loss), self._trace,
                       self.grid.cp_size)

    def graphed_programs(self, choice: GraphChoice, host_rerun: bool = False) -> dict[int, object]:
        """This rank's stage programs under `choice` (host_rerun: the graphs' plumbing replayed by the host, for
        tests without a GPU)."""
        gather = self.zero.waits.gather if self.zero is not None and self.zero.overlap else None
        return graphed(self._eager_programs, choice, str(self.device), host_rerun, self.grads,
                       {s: list(stage.parameters()) for s, stage in self._stages.items()}, gather)

    def overwrites_grads(self, schedule: ScheduleConfig) -> bool:
        """Native chains write every gradient of the rank exactly once per step in a merged W, or in the one B of
        a single micro-batch: the executor may then overwrite the gradient buffers, and the step skips zeroing
        them."""
        return ((schedule.merge_weight_grads or schedule.micro_batches == 1)
                and all(self.plans[s].native for s in self.stage_ids))
