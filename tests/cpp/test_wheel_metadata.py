"""A built wheel requires exactly the torch it was compiled against (scripts/wheel/pinned_torch.py, through
pyproject.toml's [[tool.dynamic-metadata]]), so `pip install` of it brings that torch, or refuses an environment
that holds another, instead of the newest torch of PyPI. The wheel's METADATA is what scikit-build-core's
prepare_metadata_for_build_wheel hook writes (pip asks it first; the wheel build writes the same file through the
same providers), asked here without compiling anything (a few seconds)."""
import email
import os
import subprocess
import sys

import torch

from launch_utils import REPO


def test_the_wheel_requires_exactly_the_torch_it_is_built_against(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import sys; from scikit_build_core.build import "
                           "prepare_metadata_for_build_wheel as p; print(p(sys.argv[1]))", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    dist_info = done.stdout.strip().splitlines()[-1]
    with open(os.path.join(tmp_path, dist_info, "METADATA"), encoding="utf-8") as f:
        metadata = email.message_from_file(f)
    requires = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    assert requires[0] == f"torch=={torch.__version__}", requires  # the local label too: 2.13.0+cpu, +cu128
    assert [r for r in requires if r.startswith("torch")] == requires[:1]
    assert "numpy" in requires
