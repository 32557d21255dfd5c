"""The shape of the run's model, as its registry entry gives it (ModelEntry.shape); the planner's types
(models/planner_shape.py) are named here for the planner's modules."""
from __future__ import annotations

from hybrid_engine.models import registry
from hybrid_engine.models.planner_shape import LayerShape, ModelShape

from .context import per_context_rank

__all__ = ["LayerShape", "ModelShape", "shape_of"]


def shape_of(cfg) -> ModelShape:
    """The shape of the run's model (cfg: RunConfig) on one context-parallel rank; a model the registry does not
    hold is a ConfigError."""
    return per_context_rank(registry.entry(cfg.model.name).shape(cfg), cfg.parallel.cp)
