"""hybrid_engine: DP x PP x MP training with a C++ core.

The public API, for training your own model (README.md, "Using it on your own model"):

    from hybrid_engine import Engine, ScheduleConfig, build_groups, ProcessGrid, losses, optim

The packages, bottom up: config (the dataclasses and the command line), parallel (grid, pipeline, tensor,
data_parallel), models (the MLP, the GPT, their workloads), data, checkpoint, engine (one step's wiring), runtime
(processes, faults, launch), metrics, train (the loop and the commands). Each package's __init__ says what lives
there and what it may import.

torch is imported first so that its shared libraries and pybind11 type registrations are loaded before the
compiled extension, which links against them. The extension works with the torch it was compiled against only (its
C++ symbols change between releases): `_build_info.py`, written by the build beside it, names that torch, and
another one is refused here in one line before the loader would fail on an undefined symbol.
"""
import torch  # noqa: F401  (must precede _C)


def _check_built_torch() -> None:
    try:
        from ._build_info import CUDA_VERSION, TORCH_VERSION
    except ImportError:  # not built (the _C import below says so) or built before the record existed
        return
    found, found_cuda = str(torch.__version__), torch.version.cuda or ""
    if (found, found_cuda) != (TORCH_VERSION, CUDA_VERSION):
        def named(version: str, cuda: str) -> str:
            return f"torch {version} ({f'CUDA {cuda}' if cuda else 'no CUDA'})"

        message = (f"hybrid_engine was built against {named(TORCH_VERSION, CUDA_VERSION)} but this Python has "
                   f"{named(found, found_cuda)}: install torch=={TORCH_VERSION} again, or rebuild hybrid_engine "
                   "against this torch (`pip install --no-build-isolation -e .` in its source tree, or a wheel: "
                   "`pip wheel --no-build-isolation .`, docs/cluster.md)")
        if _starts_a_command():
            raise SystemExit(f"hybrid_engine: error: {message}")
        raise ImportError(message)


def _starts_a_command() -> bool:
    """Whether this import is the start of one of hybrid_engine's commands (`python -m hybrid_engine[.X]`, whose
    package runpy imports while argv[0] is still "-m"; the `hybrid-engine` script; the hybrid_engine.py driver):
    the command then ends with the message as its one error line, where a program that imports hybrid_engine
    gets the ImportError."""
    import os
    import sys

    if sys.argv and sys.argv[0] == "-m":
        return any(arg.split(".")[0] == "hybrid_engine" for arg in getattr(sys, "orig_argv", []))
    return bool(sys.argv) and os.path.basename(sys.argv[0]) in ("hybrid-engine", "hybrid_engine.py")


_check_built_torch()

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
