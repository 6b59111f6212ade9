"""Figures are written like every other output: rendered to memory, then renamed into place."""

from __future__ import annotations

import io
from pathlib import Path

from pretrainlab import atomic


def save(fig, path: str | Path, dpi: int = 130) -> Path:
    """Write the matplotlib figure ``fig`` as a PNG at ``path`` (atomically) and close it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format="png")
    plt.close(fig)
    return atomic.write_bytes(path, buffer.getvalue())


__all__ = ["save"]
