"""Where an evaluation's data comes from: ``source`` is ``auto`` (local when a ``data_dir`` is set,
else the hub), ``hub``, ``local`` or ``synthetic`` (generated into the cache, then read as a local
directory). GLUE, NER and BLiMP resolve their ``<block>.source`` here."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def local_root(block: str, source: str, data_dir: str | None, layout: str, generate: Callable[[], Path]) -> Path | None:
    """The local directory ``block``'s data is read from, or None for the hub. ``layout`` says in the
    error what a local directory must hold; ``generate()`` writes the synthetic data and returns its
    directory."""
    if source == "auto":
        source = "local" if data_dir else "hub"
    if source == "local":
        if not data_dir:
            raise ValueError(f"{block}.source=local needs {block}.data_dir=<{layout}>.")
        return Path(os.path.expanduser(str(data_dir)))
    if source == "hub":
        return None
    if source == "synthetic":
        return generate()
    raise ValueError(f"{block}.source={source!r}: expected auto, hub, local or synthetic.")


__all__ = ["local_root"]
