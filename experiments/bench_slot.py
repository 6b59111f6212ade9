"""The slot's pretraining runs on one device, today and with each lever (MPS, CUDA graphs, a larger
batch, fused runs), side by side in one call.

The tool is ``pretrainlab.tools.bench_slot`` (its usage: ``--help``); this is its entry point."""

import sys

from pretrainlab.tools.bench_slot import main

if __name__ == "__main__":
    sys.exit(main())
