"""What a command imports before torch: W&B, when its logger logs there.

W&B defines pydantic models with attribute docstrings when its run and API modules are imported;
pydantic finds each model's source through ``inspect.getmodule``, which walks every module loaded so
far. After torch, Lightning and transformers (about 4,000 modules) that walk is most of W&B's first
``wandb.init`` in a process: 2-3 s of CPU on a 2-core machine, against a few tenths of a second when W&B
comes first (``python experiments/bench_startup.py --wandb`` measures both). Every command whose logger
is W&B (train.py, the evaluation suite, a study, the fork server of a study's processes) imports it
here, first. Nothing of torch is imported by this module.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

# the modules a W&B run imports that define pydantic models (the public API's: artifacts, registries)
WANDB_MODULES = ("wandb", "wandb.sdk.wandb_run", "wandb.apis.public")


def logs_to_wandb(logger_cfg: Any) -> bool:
    """Whether a ``logger`` config node logs to W&B (its target is a WandbLogger, not disabled)."""
    return (
        bool(logger_cfg)
        and str(logger_cfg.get("_target_", "")).endswith("WandbLogger")
        and (logger_cfg.get("mode") != "disabled")
    )


def chooses_wandb(*override_lists: Any) -> bool:
    """Whether runs composed from any of these lists of ``train.py``/suite overrides log to W&B (the
    default logger): a list that picks no ``logger=``, or picks ``logger=wandb``."""
    for overrides in override_lists:
        picked = [str(o).split("=", 1)[1] for o in overrides or [] if str(o).lstrip("+").startswith("logger=")]
        if not picked or picked[-1] == "wandb":
            return True
    return False


def import_wandb_first(logger: Any) -> bool:
    """Import W&B's modules now, while few modules are loaded, if ``logger`` logs to W&B (a ``logger``
    config node, or a bool: :func:`chooses_wandb`'s answer for a study). Returns whether it did: not when
    torch is loaded already (too late to help), W&B is not installed, or the logger is another."""
    wanted = logger if isinstance(logger, bool) else logs_to_wandb(logger)
    if not wanted or "torch" in sys.modules:
        return False
    try:
        for name in WANDB_MODULES:
            importlib.import_module(name)
    except ImportError:  # W&B is a dependency; without it the logger says so where it is made
        return False
    return True


__all__ = ["WANDB_MODULES", "chooses_wandb", "import_wandb_first", "logs_to_wandb"]
