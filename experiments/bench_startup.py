"""What it costs a study to start its processes: started fresh against forked from the fork server.

The tool is ``pretrainlab.tools.bench_startup`` (its usage: ``--help``); this is its entry point."""

import sys

from pretrainlab.tools.bench_startup import main

if __name__ == "__main__":
    sys.exit(main())
