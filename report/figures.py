"""Figures: the 3-D grid drawn from hybrid_engine.ProcessGrid, schedule timelines from the simulator, measured
traces next to their simulation, throughput bars and loss curves. Each function draws into a new Figure."""
from __future__ import annotations

from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import FancyBboxPatch, Patch, Rectangle  # noqa: E402

from hybrid_engine import ProcessGrid  # noqa: E402
from hybrid_engine.parallel.pipeline.schedule import Costs, make_schedule, simulate, timeline_rows  # noqa: E402
from hybrid_engine.metrics.timeline import TYPE_COLORS, TYPE_NAMES  # noqa: E402

from .data import Bench, Convergence, Trace, grid_of, mode_text, ok, status  # noqa: E402

PAGE = (11.69, 8.27)  # A4 landscape, inches
STAGE_COLORS = ["#8fb8de", "#f4b183", "#a9d18e", "#d5a6e6", "#ffe699", "#9dc3c1", "#f8cbad", "#c9c9c9"]
SYSTEM_COLORS = {"base": "#c0504d", "peer": "#7f7f7f", "engine": "#4c72b0"}
SYSTEMS = tuple(SYSTEM_COLORS)


def draw_grid(ax, dp: int, pp: int, mp: int, title: Optional[str] = None, small: bool = False) -> ProcessGrid:
    """One box per rank: rows are DP replicas, pipeline stages run left to right, the MP ranks of a stage sit
    side by side inside one frame (their MP group); arrows are PP neighbours, dashed lines DP groups."""
    grid = ProcessGrid(dp, pp, mp)
    w, h, gap, stage_gap, row_gap, pad = 1.0, 0.8, 0.15, 1.1, 0.9, 0.18
    stage_w = mp * w + (mp - 1) * gap + 2 * pad
    pos = {}  # rank -> (x, y) of the box's lower-left corner
    for r in range(grid.world_size):
        c = grid.coords(r)
        x = c.pp * (stage_w + stage_gap) + pad + c.mp * (w + gap)
        y = -(c.dp * (h + 2 * pad + row_gap))
        pos[r] = (x, y)
    fs = 7 if small else 9
    for d in range(dp):  # replica band = model-parallel group
        y = -(d * (h + 2 * pad + row_gap)) - pad - 0.12
        band = FancyBboxPatch((-0.25, y), pp * (stage_w + stage_gap) - stage_gap + 0.5, h + 2 * pad + 0.24,
                              boxstyle="round,pad=0.02", facecolor="#f3f3f3", edgecolor="none", zorder=0)
        ax.add_patch(band)
        members = grid.model_parallel_group_of(grid.rank_of(d, 0, 0))
        ax.text(-0.4, y + (h + 2 * pad) / 2 + 0.12, f"DP replica {d}\nmodel-parallel\ngroup {members}",
                ha="right", va="center", fontsize=fs - 1)
    for ranks in grid.groups("mp"):  # MP frames
        x0, y0 = pos[ranks[0]]
        ax.add_patch(Rectangle((x0 - pad, y0 - pad), stage_w, h + 2 * pad, fill=False, edgecolor="black", lw=1.2))
        if mp > 1:  # on the frame's left side: arcs leave from the boxes' tops and bottoms
            ax.text(x0 - pad - 0.04, y0 + h / 2, f"MP {ranks}", ha="right", va="center", rotation=90,
                    fontsize=fs - 2)
    for r, (x, y) in pos.items():
        c = grid.coords(r)
        ax.add_patch(Rectangle((x, y), w, h, facecolor=STAGE_COLORS[c.pp % len(STAGE_COLORS)], edgecolor="black",
                               lw=0.8))
        ax.text(x + w / 2, y + h * 0.62, f"rank {r}", ha="center", va="center", fontsize=fs, weight="bold")
        ax.text(x + w / 2, y + h * 0.25, f"d{c.dp} p{c.pp} m{c.mp}", ha="center", va="center", fontsize=fs - 2)
    for ranks in grid.groups("pp"):  # PP: activations forward, gradients back
        for a, b in zip(ranks, ranks[1:]):
            (xa, ya), (xb, yb) = pos[a], pos[b]
            m = grid.coords(a).mp
            up = m % 2 == 0
            ya_, yb_ = (ya + h, yb + h) if up else (ya, yb)
            rad = -(0.25 + 0.1 * (m // 2)) if up else (0.25 + 0.1 * (m // 2))
            ax.annotate("", xy=(xb + w / 2, yb_), xytext=(xa + w / 2, ya_),
                        arrowprops=dict(arrowstyle="<|-|>", color="#c0504d", lw=1.1,
                                        connectionstyle=f"arc3,rad={rad}"))
    for ranks in grid.groups("dp"):  # DP: gradient all-reduce
        for a, b in zip(ranks, ranks[1:]):
            (xa, ya), (xb, yb) = pos[a], pos[b]
            ax.plot([xa + w * 0.85, xb + w * 0.85], [ya, yb + h], ls="--", color="#2e7d32", lw=1.2)
    for p in range(pp):
        ax.text(p * (stage_w + stage_gap) + stage_w / 2, pad + h + 0.55, f"pipeline stage {p}", ha="center",
                fontsize=fs, weight="bold", color="#333333")
    ax.set_xlim(-2.6 if not small else -2.9, pp * (stage_w + stage_gap))
    ax.set_ylim(-(dp - 1) * (h + 2 * pad + row_gap) - pad - 0.9, pad + h + 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"dp={dp} x pp={pp} x mp={mp} (order {grid.order}, fastest first)", fontsize=fs + 2)
    return grid


def grid_legend(fig: Figure, pp: int) -> None:
    handles = [Patch(facecolor=STAGE_COLORS[p], edgecolor="black", label=f"pipeline stage {p}") for p in range(pp)]
    handles += [plt.Line2D([], [], color="black", lw=1.2, label="frame: MP (tensor-parallel) group"),
                plt.Line2D([], [], color="#c0504d", lw=1.2, marker=">", label="PP neighbours: activations / gradients"),
                plt.Line2D([], [], color="#2e7d32", lw=1.2, ls="--", label="DP group: gradient all-reduce"),
                Patch(facecolor="#f3f3f3", label="one DP replica (model-parallel group)")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)


def gantt(ax, rows: Sequence[Sequence[tuple]], title: str, time_label: str, xmax: Optional[float] = None,
          fontsize: int = 6) -> None:
    """rows: per rank (start, end, type, stage, micro); later chunks (stage // ranks) are drawn hatched."""
    ranks = max(len(rows), 1)
    boxes = [b for row in rows for b in row]
    t1 = xmax or max((b[1] for b in boxes), default=1.0)
    width_pts = ax.get_position().width * ax.figure.get_figwidth() * 72
    for r, row in enumerate(rows):
        for start, end, kind, stage, micro in row:
            ax.barh(r, end - start, left=start, height=0.8, color=TYPE_COLORS.get(kind, "#999999"),
                    edgecolor="black", linewidth=0.3, hatch="///" if stage // ranks else None)
            if (end - start) / t1 * width_pts >= 0.7 * fontsize * len(str(micro)) + 1:
                ax.text((start + end) / 2, r, str(micro), ha="center", va="center", fontsize=fontsize)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {r}" for r in range(len(rows))], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, t1)
    ax.set_xlabel(time_label, fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(title, fontsize=8, loc="left")
    ax.grid(axis="x", linestyle=":", linewidth=0.4)


def type_legend(fig: Figure, kinds: Sequence[str], chunks: bool = False) -> None:
    handles = [Patch(facecolor=TYPE_COLORS[k], edgecolor="black", label=TYPE_NAMES[k]) for k in kinds]
    if chunks:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="second model chunk (v=2)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)


def simulated(name: str, pp: int, micro: int) -> tuple[list, float, float]:
    """(timeline rows, bubble, makespan) of a schedule with per-rank costs F=1, B=2, I=W=1 (split over v chunks)."""
    v = 2 if name == "interleaved" else 1
    result = simulate(make_schedule(name, pp, micro, v), Costs(F=1 / v, B=2 / v, I=1 / v, W=1 / v))
    return timeline_rows(result), result.bubble, result.makespan


def schedules_figure(names: Sequence[str], pp: int, micro: int) -> tuple[Figure, dict[str, float]]:
    sims = {n: simulated(n, pp, micro) for n in names}
    fig, axes = plt.subplots(len(names), 1, figsize=PAGE)
    xmax = max(s[2] for n, s in sims.items() if n != "naive")  # naive is far longer: its own time axis
    for ax, name in zip(axes, names):
        rows, bubble, makespan = sims[name]
        label = f"{name}{' (v=2 chunks per rank)' if name == 'interleaved' else ''}: makespan {makespan:g}, " \
                f"simulated bubble {bubble:.3f}" + (" (own time axis)" if name == "naive" else "")
        gantt(ax, rows, label, "time (F = 1 unit per rank, B = 2, I = W = 1)" if ax is axes[-1] else "",
              makespan if name == "naive" else xmax)
    fig.suptitle(f"Simulated schedules at pp={pp}, m={micro} micro-batches (hybrid_engine.parallel.pipeline.schedule.simulate)",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    type_legend(fig, ["F", "B", "I", "W"], chunks=True)
    return fig, {n: s[1] for n, s in sims.items()}


def trace_parts(trace: Trace) -> dict:
    """'L_fp16_1f1b_pp2' -> config, prec, schedule, pp (what the trace's name says)."""
    parts = trace.name.split("_")
    keys = ("config", "prec", "schedule", "pp")
    out = dict(zip(keys, parts)) if len(parts) == 4 else {}
    if "pp" in out:
        out["pp"] = int(out["pp"].lstrip("pp") or 0)
    return out


def traces_figure(bench: Bench, traces: Sequence[Trace]) -> Figure:
    fig, axes = plt.subplots(len(traces), 2, figsize=PAGE, squeeze=False, gridspec_kw={"width_ratios": [1.15, 1]})
    for (ax_m, ax_s), trace in zip(axes, traces):
        s = trace.summary
        t0 = min(b[3] for row in trace.rows for b in row)
        rows = [[(b[3] - t0, b[4] - t0, b[0], b[1], b[2]) for b in row] for row in trace.rows]
        span = max(b[1] for row in rows for b in row)
        p = trace_parts(trace)
        run = bench.find(system="engine", mode=p.get("schedule"), config=p.get("config"), prec=p.get("prec"),
                         dp=1, pp=p.get("pp"), mp=1)
        step = f", median step {run['step_ms']:.2f} ms (run #{bench.index(run)})" if run and ok(run) else ""
        gantt(ax_m, rows, f"measured {trace.name}: bubble {s.get('measured_bubble', float('nan')):.3f}, "
                          f"traced span {span:.2f} ms{step}", "ms (CUDA events, last step)")
        sched = s.get("schedule", p.get("schedule", "1f1b"))
        sim_rows, bubble, _ = simulated(sched, len(trace.rows), int(s.get("micro_batches", 1)))
        gantt(ax_s, sim_rows, f"simulated {sched}, pp={len(trace.rows)}, m={s.get('micro_batches')}: "
                              f"bubble {bubble:.3f}", "time units (F=1, B=2)")
    fig.suptitle(f"Measured (left, {bench.card}) vs simulated (right) 1F1B timelines of the engine", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    type_legend(fig, sorted({b[0] for t in traces for row in t.rows for b in row} & set(TYPE_COLORS),
                            key=list(TYPE_COLORS).index))
    return fig


def throughput_figure(bench: Bench) -> tuple[Optional[Figure], list[str]]:
    """samples/s per system and schedule for each (config, precision) at dp1 pp2 mp1, the largest group on top;
    runs without numbers are labelled. Also returns the groups in which no run produced numbers."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in bench.runs:
        if grid_of(run) == (1, 2, 1):
            groups.setdefault((run.get("config"), run.get("prec")), []).append(run)
    empty = [f"{c} {p} ({len(rs)} runs {status(rs[0])})" for (c, p), rs in groups.items() if not any(map(ok, rs))]
    groups = {k: rs for k, rs in groups.items() if any(map(ok, rs))}
    if not groups:
        return None, empty
    order = sorted(groups, key=lambda k: -len(groups[k]))
    rest = order[1:]
    fig = plt.figure(figsize=PAGE)
    spec = fig.add_gridspec(2 if rest else 1, max(len(rest), 1))
    axes = [fig.add_subplot(spec[0, :])] + [fig.add_subplot(spec[1, i]) for i in range(len(rest))]
    for ax, key in zip(axes, order):
        runs = sorted(groups[key], key=lambda r: (SYSTEMS.index(r["system"]) if r.get("system") in SYSTEMS else 9,
                                                  not ok(r)))
        labels = [f"{r['system']}\n{mode_text(r)}" for r in runs]
        values = [r["samples_s"] if ok(r) else 0 for r in runs]
        bars = ax.bar(range(len(runs)), values, color=[SYSTEM_COLORS.get(r["system"], "#999999") for r in runs])
        top = max(values)
        for bar, r in zip(bars, runs):
            text = f"{r['samples_s']:,.0f}" if ok(r) else status(r)
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + 0.02 * top, text, ha="center",
                    va="bottom", fontsize=7, rotation=90, color="black" if ok(r) else "#777777")
        ax.set_ylim(0, top * 1.3)
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_title(f"config {key[0]}, {key[1]}", fontsize=9)
        ax.set_ylabel("samples/s", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(f"Throughput at dp=1 pp=2 mp=1 on 2 x {bench.card} (bars: samples/s of each run record; "
                 f"red base code, grey torch peer, blue engine)", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    return fig, empty


def convergence_figure(conv: Convergence) -> Figure:
    """Loss per step of every curve (top) and each curve's relative difference from fp32 (bottom)."""
    fig, (ax, ax_d) = plt.subplots(2, 1, figsize=PAGE, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for name, curve in conv.curves.items():
        ax.plot(range(len(curve)), curve, label=name, lw=1.2)
    ref = conv.curves.get("fp32")
    for name, curve in conv.curves.items():
        if ref and name != "fp32":
            n = min(len(ref), len(curve))
            ax_d.plot(range(n), [(c - r) / r if r else 0.0 for c, r in zip(curve[:n], ref[:n])], label=f"{name} vs fp32")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(linestyle=":", linewidth=0.5)
    ax.set_title(f"Loss curves from {conv.path.name}")
    ax_d.set_xlabel("step")
    ax_d.set_ylabel("(loss - fp32 loss) / fp32 loss")
    ax_d.axhline(0, color="black", lw=0.5)
    ax_d.grid(linestyle=":", linewidth=0.5)
    if ref and len(conv.curves) > 1:
        ax_d.legend()
    fig.tight_layout()
    return fig
