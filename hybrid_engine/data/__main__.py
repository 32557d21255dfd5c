"""`python -m hybrid_engine.data prepare ...`: data/prepare.py."""
import sys

from hybrid_engine.data.prepare import main
from hybrid_engine.runtime.entry import run_command

sys.exit(run_command("python -m hybrid_engine.data", main))
