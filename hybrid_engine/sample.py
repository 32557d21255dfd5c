"""`python -m hybrid_engine.sample`: the command lives in hybrid_engine/train/sample.py."""
import sys

from hybrid_engine.runtime.entry import run_command
from hybrid_engine.train.sample import main

if __name__ == "__main__":
    sys.exit(run_command("python -m hybrid_engine.sample", main))
