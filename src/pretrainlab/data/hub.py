"""The Hugging Face hub's reachability, for every reader of hub datasets (corpora, GLUE).

hub_offline     offline mode is set (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)
hub_reachable   the hub answers a TCP connection within a few seconds
go_offline      switch the hub libraries to offline mode in this process: the datasets cache is
                used, and a missing dataset fails at once instead of after a minute of retries
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.parse


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1"


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within ``timeout`` seconds. With a proxy
    configured, or offline mode already set, it is not probed (True, and the hub library decides)."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return True
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
        return True
    except OSError:
        return False


def go_offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    for module, attrs in (
        ("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
        ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")),
    ):
        loaded = sys.modules.get(module)
        for attr in attrs:
            if loaded is not None and hasattr(loaded, attr):
                setattr(loaded, attr, True)


__all__ = ["go_offline", "hub_offline", "hub_reachable"]
