"""Cache keys: a short, stable hash of a JSON-able description of everything that changes a result."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def fingerprint(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_digest(path: str | Path, chunk: int = 1 << 22) -> str:
    """The sha256 of a file's bytes (hex), read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
