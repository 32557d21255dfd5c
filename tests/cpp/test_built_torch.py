"""The extension records the torch (and CUDA) it was built against; under another torch, `import hybrid_engine` is
one ImportError line naming both and the rebuild command (and the driver one error line), never the loader's
undefined symbol. Another torch is simulated by changing the version the interpreter reports before the import."""
import os
import subprocess
import sys

import torch

import hybrid_engine
from launch_utils import DRIVER, REPO

OTHER = "import torch; torch.__version__ = '2.99.0+cu999'; torch.version.cuda = '99.9'; "
LINE = ("hybrid_engine was built against torch {built} (no CUDA) but this Python has torch 2.99.0+cu999 (CUDA 99.9): "
        "install torch=={built} again, or rebuild hybrid_engine against this torch (`pip install "
        "--no-build-isolation -e .` in its source tree, or a wheel: `pip wheel --no-build-isolation .`, "
        "docs/cluster.md)")
# every command, started under another torch (a sitecustomize that changes the version torch reports): that line
COMMANDS = [["-m", "hybrid_engine", "--help"], ["-m", "hybrid_engine.sample", "--help"],
            ["-m", "hybrid_engine.plan", "--help"], ["-m", "hybrid_engine.schedule", "--help"],
            ["-m", "hybrid_engine.hf", "--help"], ["-m", "hybrid_engine.data", "--help"],
            ["-m", "hybrid_engine.launch", "--help"], [str(DRIVER), "--help"]]


def test_the_build_records_the_torch_it_was_built_against():
    from hybrid_engine import _build_info

    assert _build_info.TORCH_VERSION == hybrid_engine._C.built_with_torch == str(torch.__version__)
    assert _build_info.CUDA_VERSION == hybrid_engine._C.built_with_cuda == (torch.version.cuda or "")


def test_another_torch_is_one_line_naming_both_and_the_rebuild():
    expected = LINE.format(built=torch.__version__)
    imported = subprocess.run([sys.executable, "-c", OTHER + "import hybrid_engine"], cwd=REPO, capture_output=True,
                              text=True, timeout=120)
    assert imported.returncode == 1
    assert imported.stderr.strip().splitlines()[-1] == f"ImportError: {expected}", imported.stderr
    assert "undefined symbol" not in imported.stderr
    # the driver: that line alone, as its error
    driver = subprocess.run([sys.executable, "-c", OTHER + f"import runpy; runpy.run_path({str(DRIVER)!r}, "
                             "run_name='__main__')"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert driver.returncode == 1 and driver.stderr == f"hybrid_engine: error: {expected}\n", driver.stderr


def test_every_command_under_another_torch_prints_that_line_alone(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(OTHER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    expected = f"hybrid_engine: error: {LINE.format(built=torch.__version__)}\n"
    script = os.path.join(os.path.dirname(sys.executable), "hybrid-engine")  # pip's wrapper of train/cli.py run
    for argv in COMMANDS + ([[script, "--help"]] if os.path.exists(script) else []):
        command = argv if argv[0] == script else [sys.executable, *argv]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stderr, done.stdout) == (1, expected, ""), argv
