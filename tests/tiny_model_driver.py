"""The driver with one more model: tests/tiny_model.py's, registered in this process only (each rank's), then the
command line exactly as hybrid_engine.py runs it."""
import sys

from hybrid_engine.models import register
from hybrid_engine.train.cli import run

from tiny_model import ENTRY

if __name__ == "__main__":
    register("tiny", ENTRY)
    sys.exit(run())
