"""Fine-tune a pretrained encoder on a GLUE task with Hugging Face transformers and with pretrainlab,
on the same examples with the same settings: an independent check of a fine-tuning result.

The tool is ``pretrainlab.tools.glue_reference`` (its usage: ``--help``); this is its entry point."""

import sys

from pretrainlab.tools.glue_reference import main

if __name__ == "__main__":
    sys.exit(main())
