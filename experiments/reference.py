"""Train the Hugging Face transformers reference on the batches a pretrainlab run trained on, and
judge both with the same learning checks.

The tool is ``pretrainlab.tools.reference`` (its usage: ``--help``); this is its entry point."""

import sys

from pretrainlab.tools.reference import main

if __name__ == "__main__":
    sys.exit(main())
