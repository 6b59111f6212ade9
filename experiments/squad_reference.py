"""Fine-tune a pretrained encoder on SQuAD v1.1 with Hugging Face transformers' question-answering recipe
and with pretrainlab, on the same questions with the same settings: an independent check of ``task=squad``.

The tool is ``pretrainlab.tools.squad_reference`` (its usage: ``--help``); this is its entry point."""

import sys

from pretrainlab.tools.squad_reference import main

if __name__ == "__main__":
    sys.exit(main())
