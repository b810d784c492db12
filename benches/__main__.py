"""`python -m benches`: the runner (benches/run.py), with benches/ on the path its modules use."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import main  # noqa: E402

sys.exit(main())
