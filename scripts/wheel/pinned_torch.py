"""The package's dependencies, worked out when it is built (pyproject.toml's [[tool.dynamic-metadata]]
entry): exactly the torch the C++ extension is compiled against, beside the others it lists.

The extension links against one torch's C++ symbols, which change between releases and between a release's CPU
and CUDA builds, so a wheel installed beside another torch cannot be imported. Pinning the full version, local
label included (2.13.0+cpu, 2.13.0+cu128), makes pip install that torch with the wheel, or refuse an environment
that holds another, instead of pulling the newest torch from PyPI."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def torch_requirement() -> str:
    """The requirement naming the torch this interpreter holds, the one CMakeLists.txt builds against."""
    import torch

    return f"torch=={torch.__version__}"


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, list[str]]:
    """scikit-build-core's provider hook: settings["others"] are the dependencies besides torch."""
    return {"dependencies": [torch_requirement(), *settings.get("others", [])]}
