"""`python -m hybrid_engine.schedule`: the command lives in hybrid_engine/parallel/pipeline/schedule.py."""
import sys

from hybrid_engine.parallel.pipeline.schedule import main

if __name__ == "__main__":
    sys.exit(main())
