"""Measured pipeline timelines: every compute action's start and end on every rank, for one step.

The executor times actions with CUDA events on the compute stream (host clock on the CPU). Rank 0 gathers all
ranks' spans and writes a Chrome/Perfetto trace (PATH.json: chrome://tracing or ui.perfetto.dev) and a Gantt
chart (PATH.png) next to the simulated timeline of the same schedule (PATH.simulated.png).

Measured bubble: 1 - (mean over the pipeline's ranks of the time inside compute actions) / (the step's span,
from the step's start to the last action's end on any rank) — the quantity the simulator's bubble predicts.
Two simulations stand beside it: the schedule's own (unit costs, F = 1, B = 2: the idle time the schedule
implies for equal stages), and a calibrated one with each stage's median measured F, B, I and W durations (the
idle time the schedule implies for the stages as they really are, e.g. a last stage that also computes the loss).
The measured bubble over the calibrated one is what the executor itself adds: transfers, launches, waits.
Each rank's times count from its own start of the step; ranks start a step together (the previous step ends
in a collective), so the origins agree to within that collective's skew.
"""
from __future__ import annotations

import json

import torch.distributed as dist

import statistics

from .schedule import Costs, make_schedule, simulate, timeline_rows
from .timeline import draw_timeline

Span = tuple[str, int, int, float, float]  # (type, stage, micro, start_us, end_us)


def spans_of(trace) -> list[Span]:
    return [(e.action.type.name, e.action.stage, e.action.micro, e.start_us, e.end_us) for e in trace]


def measured_bubble(rows: list[list[Span]]) -> float:
    rows = [row for row in rows if row]
    if not rows:
        return 0.0
    span = max(s[4] for row in rows for s in row) - min(0.0, min(s[3] for row in rows for s in row))
    busy = sum(s[4] - s[3] for row in rows for s in row) / len(rows)
    return 1.0 - busy / span if span > 0 else 0.0


def stage_costs(rows: list[list[Span]], num_stages: int) -> list[Costs]:
    """Per stage, the median measured duration of each action type (0 where the stage ran none)."""
    durations: dict[tuple[int, str], list[float]] = {}
    for row in rows:
        for kind, stage, _, start, end in row:
            durations.setdefault((stage, kind), []).append(end - start)

    def median(stage: int, kind: str) -> float:
        d = durations.get((stage, kind))
        return statistics.median(d) if d else 0.0

    return [Costs(median(s, "F"), median(s, "B"), median(s, "I"), median(s, "W")) for s in range(num_stages)]


def calibrated_bubble(rows: list[list[Span]], schedule: str, micro_batches: int, virtual_stages: int,
                      lookahead: int = 0) -> float:
    """The schedule's simulated bubble with each stage's measured action durations (no transfer time)."""
    program = make_schedule(schedule, len(rows), micro_batches, virtual_stages, lookahead)
    num_stages = len(rows) * virtual_stages
    return simulate(program, num_stages=num_stages, stage_costs=stage_costs(rows, num_stages)).bubble


def rows_of_chrome_trace(path: str) -> list[list[Span]]:
    """The rows a written PATH.json holds (write_trace's events), by pipeline rank."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    rows: list[list[Span]] = [[] for _ in range(1 + max((e["tid"] for e in events), default=-1))]
    for e in sorted(events, key=lambda e: e["ts"]):
        rows[e["tid"]].append((e["cat"], e["args"]["stage"], e["args"]["micro"], e["ts"], e["ts"] + e["dur"]))
    return rows


def gather_pipeline_rows(spans: list[Span], pp_rank: int, pp_size: int, in_first_replica: bool) -> list[list[Span]] | None:
    """All ranks join; rank 0 gets the rows of the pipeline of DP replica 0 / MP rank 0, by pp rank."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (pp_rank, in_first_replica, spans))
    if dist.get_rank() != 0:
        return None
    rows: list[list[Span]] = [[] for _ in range(pp_size)]
    for rank_pp, first, rank_spans in everyone:
        if first:
            rows[rank_pp] = rank_spans
    return rows


def write_trace(path: str, rows: list[list[Span]], schedule: str, micro_batches: int, virtual_stages: int,
                lookahead: int = 0) -> dict:
    events = [
        {"name": f"{stage}{kind}{micro}", "cat": kind, "ph": "X", "ts": start, "dur": end - start, "pid": 0,
         "tid": rank, "args": {"stage": stage, "micro": micro}}
        for rank, row in enumerate(rows) for kind, stage, micro, start, end in row
    ]
    measured = measured_bubble(rows)
    sim = simulate(make_schedule(schedule, len(rows), micro_batches, virtual_stages, lookahead))
    summary = {"schedule": schedule, "pp": len(rows), "micro_batches": micro_batches,
               "measured_bubble": measured, "simulated_bubble": sim.bubble,
               "calibrated_bubble": calibrated_bubble(rows, schedule, micro_batches, virtual_stages, lookahead)}
    with open(f"{path}.json", "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": summary}, f)
    to_ms = [[(s / 1e3, e / 1e3, kind, stage, micro) for kind, stage, micro, s, e in row] for row in rows]
    t0 = min((b[0] for row in to_ms for b in row), default=0.0)
    to_ms = [[(s - t0, e - t0, k, st, m) for s, e, k, st, m in row] for row in to_ms]
    draw_timeline(to_ms, f"{path}.png", title=f"measured {schedule}, pp={len(rows)}, m={micro_batches} "
                  f"(bubble {measured:.3f})", time_label="ms")
    draw_timeline(timeline_rows(sim), f"{path}.simulated.png",
                  title=f"simulated {schedule} (bubble {sim.bubble:.3f})", time_label="time units")
    return summary
