"""`python -m hybrid_engine ...`: the command line (hybrid_engine/cli.py)."""
import sys

from .cli import run

sys.exit(run(prog="python -m hybrid_engine"))
