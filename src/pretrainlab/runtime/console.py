"""One line per event on the console, and no third-party chatter.

- Lightning installs its own handler on ``lightning.pytorch`` when it is imported before logging is
  configured; under Hydra, whose handlers sit on the root logger, every Lightning line then printed
  twice. Once the root has handlers, Lightning's are removed and its records go to the root's
  handlers (the console and ``train.log``) once.
- Dropped at their source: Lightning's litlogger advertisement and its TPU/HPU availability lines,
  the ``LeafSpec`` deprecation raised inside Lightning, matplotlib's font-cache notice.
"""

from __future__ import annotations

import logging
import warnings

DROPPED = ("litlogger", "TPU available", "HPU available", "was configured so 100% of the batches")


class _DropChatter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in DROPPED)


_FILTER = _DropChatter()


def quiet_third_parties() -> None:
    """Apply the rules above (idempotent)."""
    root = logging.getLogger()
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logger = logging.getLogger(name)
        if root.handlers:
            for handler in list(logger.handlers):
                logger.removeHandler(handler)
            logger.propagate = True
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    warnings.filterwarnings("ignore", message=r".*LeafSpec.*deprecated")
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)


__all__ = ["quiet_third_parties"]
