"""What every layer may need of the configuration: the error a bad setting raises, and plain
containers of composed (OmegaConf) nodes. Imports nothing of the package, so ``runtime/``, ``model/``
and the rest can all use it."""

from __future__ import annotations

from typing import Any, cast

from omegaconf import OmegaConf


class ConfigError(ValueError):
    """A configuration that cannot work, with a sentence saying why and what to change."""


def plain(node: Any) -> dict[str, Any]:
    """A composed mapping as a plain, resolved ``dict``."""
    return cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))


def plain_or_none(node: Any) -> dict[str, Any] | None:
    """:func:`plain` of a block that may be unset (``None`` or empty: ``None``)."""
    return plain(node) if node else None


__all__ = ["ConfigError", "plain", "plain_or_none"]
