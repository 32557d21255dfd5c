"""`python -m hybrid_engine.launch`: the command lives in hybrid_engine/runtime/launch.py."""
import sys

from hybrid_engine.runtime.launch import main

if __name__ == "__main__":
    sys.exit(main())
