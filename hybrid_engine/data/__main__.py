"""`python -m hybrid_engine.data prepare ...`: data/prepare.py."""
import sys

from hybrid_engine.data.prepare import main

sys.exit(main())
