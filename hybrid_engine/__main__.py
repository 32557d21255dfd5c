"""`python -m hybrid_engine ...`: the command line (hybrid_engine/train/cli.py)."""
import sys

from hybrid_engine.train.cli import run

sys.exit(run(prog="python -m hybrid_engine"))
