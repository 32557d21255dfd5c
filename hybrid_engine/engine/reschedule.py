"""Mixed into Engine: another schedule of the same stages from the next step on (the planner's switch after it
refits its cost model, hybrid_engine/planner/refit.py); every stage, parameter, gradient buffer and optimizer
state stays, and the executor is built again on the next step."""
from __future__ import annotations

from hybrid_engine.config.engine import ScheduleConfig
from hybrid_engine.parallel.pipeline.schedule import make_schedule


class Reschedule:
    """Reads and sets the Engine's schedule, micro-batch count, actions and executor."""

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
        self._executor = None

    def overwrites_grads(self, schedule: ScheduleConfig) -> bool:
        """Native chains write every gradient of the rank exactly once per step in a merged W, or in the one B of
        a single micro-batch: the executor may then overwrite the gradient buffers, and the step skips zeroing
        them."""
        return ((schedule.merge_weight_grads or schedule.micro_batches == 1)
                and all(self.plans[s].native for s in self.stage_ids))
