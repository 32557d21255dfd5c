"""Gantt picture of a pipeline step: one row per rank, one box per compute action.

The input is generic so that the same picture serves simulated schedules (hybrid_engine.parallel.pipeline.schedule.timeline_rows)
and measured traces: per rank a list of ``(start, end, type, stage, micro)`` with times in any unit (name it with
``time_label``), ``type`` one of "F", "B", "I", "W" (anything else is drawn grey), ``stage`` the global virtual
stage. Stage s is on rank s % ranks, so its chunk is s // ranks; later chunks are drawn lighter. `extra_rows`
(label, row) are drawn under the ranks' rows, e.g. a traced step's DP collectives (type: the collective's kind,
micro: its bucket).
"""
from __future__ import annotations

from typing import Sequence

TYPE_COLORS = {"F": "#4c72b0", "B": "#55a868", "I": "#dd8452", "W": "#8172b3", "all_reduce": "#c44e52",
               "reduce_scatter": "#c44e52", "all_gather": "#ccb974"}
TYPE_NAMES = {"F": "F forward", "B": "B backward", "I": "I input-grad backward", "W": "W weight-grad backward",
              "all_reduce": "DP all-reduce (bucket)", "reduce_scatter": "DP reduce-scatter (bucket)",
              "all_gather": "DP parameter all-gather (bucket)"}
OTHER_COLOR = "#999999"

Row = Sequence[tuple[float, float, str, int, int]]


def _lighten(color: str, amount: float) -> tuple[float, float, float]:
    """Mix color with white: amount 0 keeps it, 1 is white."""
    rgb = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    return tuple(c + (1 - c) * amount for c in rgb)  # type: ignore[return-value]


def draw_timeline(rows: Sequence[Row], path: str, title: str = "", time_label: str = "time",
                  row_label: str = "rank", extra_rows: Sequence[tuple[str, Row]] = ()) -> None:
    """Draw rows (rank 0 on top), then extra_rows, to an image file; the format follows the extension (png, pdf,
    svg)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = max(len(rows), 1)
    labels = [f"{row_label} {r}" for r in range(len(rows))] + [label for label, _ in extra_rows]
    rows = list(rows) + [row for _, row in extra_rows]
    boxes = [box for row in rows for box in row]
    t0 = min((b[0] for b in boxes), default=0.0)
    t1 = max((b[1] for b in boxes), default=1.0)
    span = max(t1 - t0, 1e-12)
    chunks = 1 + max((b[3] // ranks for b in boxes), default=0)

    width_in = min(40.0, max(8.0, 0.09 * sum(1 for _ in boxes) / ranks + 4))
    fig, ax = plt.subplots(figsize=(width_in, 0.55 * len(rows) + 1.4))
    points_per_unit = width_in * 72 * 0.85 / span  # roughly the axes' share of the figure width
    fontsize = 7

    for r, row in enumerate(rows):
        for start, end, kind, stage, micro in row:
            base = TYPE_COLORS.get(kind, OTHER_COLOR)
            color = _lighten(base, 0.55 * (stage // ranks) / max(chunks - 1, 1)) if chunks > 1 else base
            # collectives in flight together overlap: half-transparent, so each stays visible
            alpha = 1.0 if r < ranks else 0.6
            ax.barh(r, end - start, left=start, height=0.8, color=color, edgecolor="black", linewidth=0.4,
                    alpha=alpha)
            label = str(micro)
            if (end - start) * points_per_unit >= 0.65 * fontsize * len(label) + 2:
                ax.text((start + end) / 2, r, label, ha="center", va="center", fontsize=fontsize)

    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # rank 0 on top
    ax.set_xlim(t0, t1)
    ax.set_xlabel(time_label)
    if title:
        ax.set_title(title)
    present = sorted({b[2] for b in boxes}, key=lambda k: list(TYPE_COLORS).index(k) if k in TYPE_COLORS else 99)
    handles = [Patch(facecolor=TYPE_COLORS.get(k, OTHER_COLOR), edgecolor="black", label=TYPE_NAMES.get(k, k))
               for k in present]
    if chunks > 1:
        handles.append(Patch(facecolor="white", edgecolor="none", label=f"lighter: later chunk (of {chunks})"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="x", linestyle=":", linewidth=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
