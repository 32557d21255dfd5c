"""What rank 0 tells the user while training: step lines (or one live status line on a terminal), the metrics
file, and the closing summary."""
from __future__ import annotations

import errno
import json
import statistics
import sys
import time
from typing import TextIO

from hybrid_engine.metrics.tensorboard import TensorBoardWriter


class Progress:
    """Rank 0's reports of a run; on every other rank each method does nothing.

    When stdout is a terminal, steps update one status line in place (step, loss, throughput, ETA); otherwise
    every `log_every`-th step prints a line (`step    3  loss 0.123456  ...`), which logs and tests read."""

    def __init__(self, rank: int, *, steps: int, batch_size: int, log_every: int = 1, quiet: bool = False,
                 metrics: str | None = None, append: bool = False, stream: TextIO | None = None,
                 tensorboard: str | None = None):
        self.enabled = rank == 0
        self.stream = stream or sys.stdout
        self.steps, self.batch_size, self.log_every, self.quiet = steps, batch_size, log_every, quiet
        self.live = self.enabled and not quiet and self.stream.isatty()
        # a resumed run appends: the file then holds the whole history (replayed steps appear twice, the last wins)
        self.metrics_path, self.metrics = metrics, None
        self.failed: tuple[str, int] | None = None  # (the flag and file that could not be written, errno)
        if metrics and self.enabled:
            try:
                self.metrics = open(metrics, "a" if append else "w")
            except OSError as exc:
                self.failed = (f"--metrics {metrics}", exc.errno or errno.EIO)
        # --tensorboard DIR: the same records as scalars (hybrid_engine/metrics/tensorboard.py)
        self.tensorboard = TensorBoardWriter(tensorboard) if tensorboard and self.enabled else None
        self._status = False  # a status line is on screen, unterminated
        # The last step's line in the metrics file (its offset and record) and the lines written after it: a record
        # about that step that has no step of its own (the trace of it) joins its line (see record).
        self._last_step: tuple[int, dict] | None = None
        self._after_last_step: list[dict] = []
        self._started = time.monotonic()
        self._done = 0

    def step(self, record: dict) -> None:
        """One finished step: its metrics record (step, loss, step_time_s, samples_per_s, loss_scale, ...)."""
        if not self.enabled:
            return
        self._done += 1
        if self.metrics is not None:
            self._last_step, self._after_last_step = (self.metrics.tell(), record), []
        self._write_metrics(record)
        if self.quiet:
            return
        step = record["step"]
        scale = record.get("loss_scale")
        extra = f"  scale {scale:g}{' SKIPPED' if record.get('skipped') else ''}" if scale else ""
        if self.live:
            per_step = (time.monotonic() - self._started) / self._done
            eta = int(per_step * max(0, self.steps - step - 1))
            line = (f"step {step + 1}/{self.steps}  loss {record['loss']:.6f}  {record['samples_per_s']:.1f} "
                    f"samples/s  ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}{extra}")
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()
            self._status = True
        elif (step + 1) % self.log_every == 0 or step + 1 == self.steps:
            print(f"step {step:4d}  loss {record['loss']:.6f}  {record['step_time_s'] * 1e3:8.2f} ms  "
                  f"{record['samples_per_s']:10.1f} samples/s{extra}", file=self.stream, flush=True)

    def say(self, line: str, verbose: bool = False) -> None:
        """A line of its own (a saved checkpoint, the summary); `verbose` lines are left out under --quiet."""
        if not self.enabled or (verbose and self.quiet):
            return
        if self._status:
            self.stream.write("\n")
            self._status = False
        print(line, file=self.stream, flush=True)

    def record(self, extra: dict) -> None:
        """A metrics record that is not a step's own. With a "step" (a validation loss) it is a line of its own,
        after that step's; without one it is about the last step (the trace of it) and joins that step's line, so
        that every line is about one step and the file's last line is still the last step's."""
        if "step" in extra or self._last_step is None or self.metrics is None:
            self._after_last_step.append(extra)
            self._write_metrics(extra)
            return
        offset, step = self._last_step
        merged = {**step, **extra}
        self._last_step = (offset, merged)
        try:
            self.metrics.seek(offset)
            self.metrics.truncate()
        except OSError as exc:
            self.failed = (f"--metrics {self.metrics_path}", exc.errno or errno.EIO)
            self._close_metrics()
            return
        for line in (merged, *self._after_last_step):
            self._write_metrics(line)

    def _write_metrics(self, record: dict) -> None:
        """One JSON line, flushed; a failed write (a full disk) is kept in `failed` for the trainer to report on
        every rank, and nothing more is written."""
        if self.tensorboard is not None:
            self.tensorboard.write(record)
        if self.metrics is None:
            return
        try:
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()
        except OSError as exc:
            self.failed = (f"--metrics {self.metrics_path}", exc.errno or errno.EIO)
            self._close_metrics()

    def _close_metrics(self) -> None:
        metrics, self.metrics = self.metrics, None
        try:
            metrics.close()
        except OSError as exc:  # the buffered tail could not be flushed
            self.failed = self.failed or (f"--metrics {self.metrics_path}", exc.errno or errno.EIO)

    def close(self) -> None:
        if self._status:
            self.stream.write("\n")
            self.stream.flush()
            self._status = False
        if self.metrics:
            self._close_metrics()
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


def summary_line(grid, schedule: str, batch_size: int, times: list[float], left_out: int,
                 peaks: list[float]) -> str:
    """The closing line: the median over the timed steps, naming how many of this run's steps were left out."""
    ranks = f"{grid.world_size} rank{'' if grid.world_size == 1 else 's'}"
    cp = f"{grid.cp_size} cp x " if grid.cp_size > 1 else ""
    head = (f"summary: {ranks} ({grid.dp_size} dp x {cp}{grid.pp_size} pp x {grid.mp_size} mp), "
            f"schedule {schedule}, ")
    if not times:
        return head + f"no timed steps (all {left_out} of this run's steps were warm-up)"
    median = statistics.median(times)
    warm = f"after {left_out} warm-up step{'' if left_out == 1 else 's'}" if left_out else "no warm-up steps left out"
    return (head + f"median step {median * 1e3:.2f} ms {warm}, {batch_size / median:.1f} samples/s, "
            f"peak memory per rank (GiB) {peaks}")


def flops_text(tflops_per_rank: float, device_type: str) -> str:
    """The summary's model FLOP rate: TFLOP/s per GPU on CUDA; on a CPU, where a rank is no GPU and a small model
    runs at a few GFLOP/s, GFLOP/s per rank."""
    if device_type == "cuda":
        return f"{tflops_per_rank:.3g} model TFLOP/s per GPU"
    return f"{tflops_per_rank * 1e3:.3g} model GFLOP/s per rank"
