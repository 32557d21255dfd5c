"""What a step's update depends on besides the state a checkpoint holds: the lr schedule and the optimizer's
settings (betas, weight decay, gradient clipping), each resolved to the value the run uses. The manifest records
both; a run that continues a checkpoint with other values says which, once, before its first step
(checkpoint/update_settings.py), so no change to the update goes unsaid."""
from __future__ import annotations

from hybrid_engine.config.checks import parse_betas

from .lr_schedule import LRSchedule

DEFAULT_BETAS = "0.9,0.999"  # torch's, for adam and adamw
DEFAULT_WEIGHT_DECAY = 0.01  # torch's AdamW default (optim/optimizers.py)


def optimizer_settings(cfg, model_clip_grad: float) -> dict:
    """The optimizer's settings this run steps with; model_clip_grad: the clipping norm of the model when
    --clip-grad is unsaid (its workload's)."""
    o = cfg.optimizer
    clip = cfg.precision.clip_grad if cfg.precision.clip_grad is not None else model_clip_grad
    settings: dict = {"clip_grad": float(clip or 0.0)}
    if o.name in ("adam", "adamw"):
        settings["betas"] = ",".join(f"{b:g}" for b in parse_betas(o.betas or DEFAULT_BETAS))
    if o.name == "adamw":
        settings["weight_decay"] = float(o.weight_decay if o.weight_decay is not None else DEFAULT_WEIGHT_DECAY)
    return settings


def update_settings(cfg, model_clip_grad: float) -> dict:
    """{manifest key: this run's value} for every setting checkpoint/update_settings.py records."""
    return {"lr_schedule": LRSchedule.of(cfg.optimizer, cfg.training.steps).as_dict(),
            "optimizer_settings": optimizer_settings(cfg, model_clip_grad)}
