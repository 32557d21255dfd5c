"""Measured pipeline timelines: every compute action's start and end on every rank, for one step, and beside them
the step's DP and MP collectives.

The executor times actions with CUDA events on the compute stream (host clock on the CPU). Rank 0 gathers all
ranks' spans and writes a Chrome/Perfetto trace (PATH.json: chrome://tracing or ui.perfetto.dev) and a Gantt
chart (PATH.png) next to the simulated timeline of the same schedule (PATH.simulated.png).

DP collectives (csrc/comm/comm_trace.h): each gradient bucket's all-reduce (reduce-scatter under ZeRO on NCCL;
gloo has none and all-reduces) from launch to completion, once a step or (ZeRO-2/3 without a pipeline) after every
micro-batch's backward, and each parameter all-gather the step waited for: under ZeRO-1/2 launched by the previous
step's update, so before the step's start; under ZeRO-3 ahead of the layers that read the bucket, for each forward
and again for each backward where an autograd stage without a pipeline releases its parameters in between, else
once a step (hybrid_engine/parallel/data_parallel/param_shards.py). In the JSON they are process 1 ("DP
collectives"), one thread per pipeline rank, beside process 0's compute actions; in the PNG they are the rows under
the pipeline's. MP collectives (the all-reduces and all-gathers of native tensor-parallel
chains, one per layer and row chunk, csrc/tp/linear_chain.h) are process 2 ("MP collectives") and the rows under
those, from MP rank 0's view. Context parallelism's transfers (each hop of the ring, send_recv with its hop
number; the K/V all-gathers and the dK/dV reduce-scatters, hybrid_engine/parallel/context) are process 3 ("CP
transfers"), from CP rank 0's view. The JSON's times count from its earliest event (otherData.step_start_us says where
the step began).

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

from hybrid_engine.parallel.pipeline.schedule import Costs, make_schedule, schedule_placement, simulate, timeline_rows
from .timeline import draw_timeline

Span = tuple[str, int, int, float, float]  # (type, stage, micro, start_us, end_us)
CommSpan = tuple[str, int, float, float]  # (kind, bucket, start_us, end_us)
COMM_PID = 1  # the JSON's process of the DP collectives (0: compute)
MP_COMM_PID = 2  # and of the MP collectives
CP_COMM_PID = 3  # and of the CP transfers
AXIS_PIDS = {"dp": COMM_PID, "mp": MP_COMM_PID, "cp": CP_COMM_PID}


def spans_of(trace) -> list[Span]:
    return [(e.action.type.name, e.action.stage, e.action.micro, e.start_us, e.end_us) for e in trace]


def comm_spans_of(comm_trace, axis: str = "dp") -> list[CommSpan]:
    """Engine.comm_trace's collectives of one axis (dp | mp | cp) as plain tuples (MP: `bucket` is the layer; CP:
    the hop)."""
    return [(c.kind, c.bucket, c.start_us, c.end_us) for c in comm_trace if c.axis == axis]


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
    return simulate(program, num_stages=num_stages, stage_costs=stage_costs(rows, num_stages),
                    placement=schedule_placement(schedule)).bubble


def _read_trace(path: str) -> tuple[list[dict], float]:
    with open(path) as f:
        trace = json.load(f)
    return trace["traceEvents"], trace.get("otherData", {}).get("step_start_us", 0.0)


def rows_of_chrome_trace(path: str) -> list[list[Span]]:
    """The compute rows a written PATH.json holds (write_trace's events), by pipeline rank, on the step's clock."""
    events, origin = _read_trace(path)
    events = [e for e in events if e.get("ph") == "X" and e.get("pid", 0) == 0]
    rows: list[list[Span]] = [[] for _ in range(1 + max((e["tid"] for e in events), default=-1))]
    for e in sorted(events, key=lambda e: e["ts"]):
        start = e["ts"] - origin
        rows[e["tid"]].append((e["cat"], e["args"]["stage"], e["args"]["micro"], start, start + e["dur"]))
    return rows


def comm_rows_of_chrome_trace(path: str, axis: str = "dp") -> list[list[CommSpan]]:
    """The DP (or MP) collectives a written PATH.json holds, by pipeline rank, on the step's clock."""
    events, origin = _read_trace(path)
    events = [e for e in events if e.get("ph") == "X" and e.get("pid") == AXIS_PIDS[axis]]
    rows: list[list[CommSpan]] = [[] for _ in range(1 + max((e["tid"] for e in events), default=-1))]
    for e in sorted(events, key=lambda e: e["ts"]):
        start = e["ts"] - origin
        rows[e["tid"]].append((e["cat"], e["args"]["bucket"], start, start + e["dur"]))
    return rows


def gather_pipeline_rows(spans: list[Span], pp_rank: int, pp_size: int, in_first_replica: bool,
                         comm: list[CommSpan] = (), mp_comm: list[CommSpan] = (), cp_comm: list[CommSpan] = ()
                         ) -> tuple[list[list[Span]], ...] | None:
    """All ranks join; rank 0 gets the rows of the pipeline of DP replica 0 / CP rank 0 / MP rank 0 by pp rank:
    its compute spans, its DP collectives, its MP collectives and its CP transfers."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (pp_rank, in_first_replica, spans, list(comm), list(mp_comm), list(cp_comm)))
    if dist.get_rank() != 0:
        return None
    out: tuple[list[list], ...] = tuple([[] for _ in range(pp_size)] for _ in range(4))
    for rank_pp, first, *rank_rows in everyone:
        if first:
            for rows, mine in zip(out, rank_rows):
                rows[rank_pp] = mine
    return out


def write_trace(path: str, rows: list[list[Span]], schedule: str, micro_batches: int, virtual_stages: int,
                lookahead: int = 0, comm_rows: list[list[CommSpan]] | None = None,
                mp_comm_rows: list[list[CommSpan]] | None = None, cp_comm_rows: list[list[CommSpan]] | None = None
                ) -> dict:
    comm_rows = comm_rows if any(comm_rows or []) else []
    mp_comm_rows = mp_comm_rows if any(mp_comm_rows or []) else []
    cp_comm_rows = cp_comm_rows if any(cp_comm_rows or []) else []
    # Chrome and Perfetto want times from 0: the file counts from its earliest event (a gather launched before the
    # step), and says where the step began.
    origin = -min([0.0] + [start for row in comm_rows + mp_comm_rows + cp_comm_rows for _, _, start, _ in row])
    events = [
        {"name": f"{stage}{kind}{micro}", "cat": kind, "ph": "X", "ts": start + origin, "dur": end - start, "pid": 0,
         "tid": rank, "args": {"stage": stage, "micro": micro}}
        for rank, row in enumerate(rows) for kind, stage, micro, start, end in row
    ]
    events += [
        {"name": f"{kind} bucket {bucket}", "cat": kind, "ph": "X", "ts": start + origin, "dur": end - start,
         "pid": COMM_PID, "tid": rank, "args": {"bucket": bucket}}
        for rank, row in enumerate(comm_rows) for kind, bucket, start, end in row
    ]
    events += [
        {"name": f"{kind} layer {layer}", "cat": kind, "ph": "X", "ts": start + origin, "dur": end - start,
         "pid": MP_COMM_PID, "tid": rank, "args": {"bucket": layer}}
        for rank, row in enumerate(mp_comm_rows) for kind, layer, start, end in row
    ]
    events += [
        {"name": f"cp {kind} hop {hop}", "cat": kind, "ph": "X", "ts": start + origin, "dur": end - start,
         "pid": CP_COMM_PID, "tid": rank, "args": {"bucket": hop}}
        for rank, row in enumerate(cp_comm_rows) for kind, hop, start, end in row
    ]
    processes = [(pid, name) for pid, name, present in (
        (0, "compute (thread: pipeline rank)", True),
        (COMM_PID, "DP collectives (thread: pipeline rank)", bool(comm_rows)),
        (MP_COMM_PID, "MP collectives (thread: pipeline rank)", bool(mp_comm_rows)),
        (CP_COMM_PID, "CP transfers (thread: pipeline rank)", bool(cp_comm_rows))) if present]
    if len(processes) > 1:
        events += [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}} for pid, name in processes]
    measured = measured_bubble(rows)
    sim = simulate(make_schedule(schedule, len(rows), micro_batches, virtual_stages, lookahead),
                   placement=schedule_placement(schedule))
    summary = {"schedule": schedule, "pp": len(rows), "micro_batches": micro_batches,
               "measured_bubble": measured, "simulated_bubble": sim.bubble,
               "calibrated_bubble": calibrated_bubble(rows, schedule, micro_batches, virtual_stages, lookahead),
               "step_start_us": origin}
    for key, axis_rows in (("dp_collectives", comm_rows), ("mp_collectives", mp_comm_rows),
                           ("cp_transfers", cp_comm_rows)):
        if axis_rows:
            summary[key] = {kind: sum(1 for row in axis_rows for k, *_ in row if k == kind)
                            for kind in sorted({k for row in axis_rows for k, *_ in row})}
    with open(f"{path}.json", "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms", "otherData": summary}, f)
    to_ms = [[(s / 1e3, e / 1e3, kind, stage, micro) for kind, stage, micro, s, e in row] for row in rows]
    comm_ms = [[(s / 1e3, e / 1e3, kind, 0, bucket) for kind, bucket, s, e in row] for row in comm_rows]
    mp_ms = [[(s / 1e3, e / 1e3, kind, 0, layer) for kind, layer, s, e in row] for row in mp_comm_rows]
    cp_ms = [[(s / 1e3, e / 1e3, kind, 0, hop) for kind, hop, s, e in row] for row in cp_comm_rows]
    t0 = min((b[0] for row in to_ms + comm_ms + mp_ms + cp_ms for b in row), default=0.0)
    to_ms = [[(s - t0, e - t0, k, st, m) for s, e, k, st, m in row] for row in to_ms]
    extra = [(f"rank {r} {axis}", [(s - t0, e - t0, k, st, m) for s, e, k, st, m in row])
             for axis, axis_ms in (("DP", comm_ms), ("MP", mp_ms), ("CP", cp_ms)) for r, row in enumerate(axis_ms)
             if row]
    draw_timeline(to_ms, f"{path}.png", title=f"measured {schedule}, pp={len(rows)}, m={micro_batches} "
                  f"(bubble {measured:.3f})", time_label="ms", extra_rows=extra)
    draw_timeline(timeline_rows(sim), f"{path}.simulated.png",
                  title=f"simulated {schedule} (bubble {sim.bubble:.3f})", time_label="time units")
    return summary
