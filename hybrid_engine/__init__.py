"""hybrid_engine: DP x PP x MP training with a C++ core.

The public API, for training your own model (README.md, "Using it on your own model"):

    from hybrid_engine import Engine, ScheduleConfig, build_groups, ProcessGrid, losses, optim

The packages, bottom up: config (the dataclasses and the command line), parallel (grid, pipeline, tensor,
data_parallel), models (the MLP, the GPT, their workloads), data, checkpoint, engine (one step's wiring), runtime
(processes, faults, launch), metrics, train (the loop and the commands). Each package's __init__ says what lives
there and what it may import.

torch is imported first so that its shared libraries and pybind11 type registrations are loaded before the
compiled extension, which links against them.
"""
import torch  # noqa: F401  (must precede _C)

try:
    from . import _C
except ImportError as exc:  # pragma: no cover - exercised only on a broken install
    raise ImportError(
        "hybrid_engine._C is not built. Run `pip install --no-build-isolation -e .` in the repository root "
        f"(see README.md). Original error: {exc}"
    ) from exc

ProcessGrid = _C.ProcessGrid

from hybrid_engine.config.engine import (ConfigError, DataParallelConfig, PrecisionConfig,  # noqa: E402
                                         ScheduleConfig, StageConfig)
from hybrid_engine import optim  # noqa: E402
from hybrid_engine.models import losses  # noqa: E402
from hybrid_engine.engine.engine import Engine, StepResult  # noqa: E402
from hybrid_engine.parallel.grid import GridGroups, build_groups  # noqa: E402

__all__ = ["ConfigError", "DataParallelConfig", "Engine", "GridGroups", "PrecisionConfig", "ProcessGrid",
           "ScheduleConfig", "StageConfig", "StepResult", "build_groups", "losses", "optim", "_C"]
