"""Cache keys: a short, stable hash of a JSON-able description of everything that changes a result."""

from __future__ import annotations

import hashlib
import json


def fingerprint(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
