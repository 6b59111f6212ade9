"""Which code a slot ran: a digest of the package's source and the configs, which a machine without
the git history (a copy of the working tree) computes as well as a checkout, and the commit where
there is one. Slots merge only when their code is the same (``archive.merge``)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from pretrainlab.runtime.hydra import CONF
from pretrainlab.runtime.provenance import software


@functools.cache
def code_version() -> dict:
    """``digest``: sha256 over every ``.py`` file of the package and every ``.yaml`` file of
    ``conf/`` (their paths and bytes); ``commit``/``dirty`` from git when the package is a checkout's."""

    package = Path(__file__).resolve().parents[1]  # src/pretrainlab
    h = hashlib.sha256()
    for root, pattern in ((package, "*.py"), (CONF, "*.yaml")):
        for f in sorted(root.rglob(pattern)):
            h.update(f"{root.name}/{f.relative_to(root).as_posix()}\0".encode())
            h.update(f.read_bytes())
            h.update(b"\0")
    recorded = software()
    return {"digest": h.hexdigest()[:16], "commit": recorded.get("commit"), "dirty": recorded.get("dirty")}


__all__ = ["code_version"]
