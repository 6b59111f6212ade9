"""Where a training step's time goes: the top kernels (GPU) or operators (CPU) of our step, by time.

The tool is ``pretrainlab.tools.profile_step`` (its usage: ``--help``); this is its entry point."""

import sys

from pretrainlab.tools.profile_step import main

if __name__ == "__main__":
    sys.exit(main())
