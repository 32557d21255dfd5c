"""hybrid_engine: DP x PP x MP training with a C++ core.

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

__all__ = ["ProcessGrid", "_C"]
