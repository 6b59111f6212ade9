"""A GLUE task's fine-tuning seeds one after another against fused into one model, in the same call.

The tool is ``pretrainlab.tools.bench_finetune`` (its usage: ``--help``); this is its entry point."""

import sys

from pretrainlab.tools.bench_finetune import main

if __name__ == "__main__":
    sys.exit(main())
