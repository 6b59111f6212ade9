"""Cache keys: a short, stable hash of a JSON-able description of everything that changes a result."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def fingerprint(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# (path, device, inode, size, mtime in ns) -> sha256: a file is read once per version of it
_digests: dict[tuple, str] = {}


def file_digest(path: str | Path, chunk: int = 1 << 22) -> str:
    """The sha256 of a file's bytes (hex), read in chunks. Remembered for this process while the file
    is unchanged (same inode, size and modification time): a suite that checks its encoder's weights
    before and after every task and seed reads them once; a file written again (atomically: a new
    inode) or modified in place (a new mtime) is read again."""
    st = Path(path).stat()
    key = (str(Path(path).resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _digests:
        return _digests[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    if Path(path).stat().st_mtime_ns == st.st_mtime_ns:  # not written while it was read
        _digests[key] = h.hexdigest()
    return h.hexdigest()
