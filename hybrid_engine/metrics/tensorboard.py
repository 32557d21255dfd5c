"""`--tensorboard DIR`: every step's metrics as TensorBoard scalars, written by rank 0 through
torch.utils.tensorboard (the `tensorboard` package is an optional dependency: config/output_paths.py refuses the flag
in one line, before the first collective, when it is missing).

    tensorboard --logdir DIR

Tags, from the step's metrics record (train/progress.py): train/loss, train/lr (when the run has a learning-rate
schedule that records it), train/grad_norm (with clipping), throughput/samples_per_s, throughput/tokens_per_s,
throughput/mfu (on a card with a known peak), time/step_s, memory/peak_gib (the largest over the ranks),
precision/loss_scale (fp16); val/loss from the validation records.
"""
from __future__ import annotations

TAGS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "samples_per_s": "throughput/samples_per_s",
    "tokens_per_s": "throughput/tokens_per_s",
    "mfu": "throughput/mfu",
    "step_time_s": "time/step_s",
    "loss_scale": "precision/loss_scale",
    "val_loss": "val/loss",
}


def scalars(record: dict) -> dict[str, float]:
    """{tag: value} of one metrics record: the numbers it has (None, absent and booleans are left out)."""
    out = {tag: float(record[key]) for key, tag in TAGS.items()
           if isinstance(record.get(key), (int, float)) and not isinstance(record.get(key), bool)}
    peaks = record.get("peak_mem_gib")
    if peaks:
        out["memory/peak_gib"] = float(max(peaks))
    return out


class TensorBoardWriter:
    """An event file under `directory`; one scalar per tag per step, flushed as each step is written."""

    def __init__(self, directory: str):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when asked for

        self.writer = SummaryWriter(log_dir=directory)

    def write(self, record: dict) -> None:
        if "step" not in record:
            return
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, global_step=record["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
