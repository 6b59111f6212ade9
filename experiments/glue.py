"""The old name of ``experiments/suite.py``, the evaluation suite of one encoder (GLUE's tasks and the
evaluations beyond it): it says so, then runs that script with the same arguments."""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    suite = Path(__file__).with_name("suite.py")
    print(
        "experiments/glue.py is the old name of experiments/suite.py (the evaluation suite is more than GLUE): "
        "it still works, and will be removed; run experiments/suite.py instead.",
        file=sys.stderr,
    )
    sys.argv[0] = str(suite)  # the command a stopped suite prints to continue it names the new script
    runpy.run_path(str(suite), run_name="__main__")
