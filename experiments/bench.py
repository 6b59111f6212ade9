"""Pretraining-step speed: pretrainlab against Hugging Face transformers, same inputs, same run.

The tool is ``pretrainlab.tools.bench`` (its usage: ``--help``); this is its entry point."""

import sys

from pretrainlab.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
