"""The device a slot runs on, as the slot reports it: what it is (``describe``), and how busy it was
over time (:class:`Utilisation`: ``nvidia-smi`` sampled in a thread, so that the slot's own process
never opens a CUDA context of its own beside its jobs').

GPU utilisation is ``nvidia-smi``'s ``utilization.gpu``: the share of the sample period in which at
least one kernel ran. It says whether the device waited for its jobs, not how much of its
arithmetic they used (that is the FLOPs per second the slot reports beside it).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import threading
import time


def _smi(*query: str) -> list[list[str]] | None:
    """``nvidia-smi --query-gpu=...`` rows of the GPUs this process may use; None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu=index,{','.join(query)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible and all(v.strip().isdigit() for v in visible.split(",")):
        keep = {v.strip() for v in visible.split(",")}
        rows = [r for r in rows if r[0] in keep]
    return [r[1:] for r in rows] or None


def describe() -> dict:
    """The machine: its GPUs (name, memory, driver) or ``cpu``, the CPU cores, torch and CUDA versions."""
    import torch

    gpus = _smi("name", "memory.total", "driver_version")
    return {
        "device": ", ".join(f"{g[0]} ({g[1]} MiB)" for g in gpus) if gpus else "cpu",
        "driver": gpus[0][2] if gpus else None,
        "gpus": len(gpus) if gpus else 0,
        "cpu_cores": os.cpu_count(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


class Utilisation:
    """Samples every ``interval`` seconds, from :meth:`start` to :meth:`stop`, the GPUs' utilisation
    (mean over the visible GPUs, percent) and memory in use (MiB, summed); on a machine without
    ``nvidia-smi`` it records nothing and every mean is None."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.samples: list[tuple[float, float, float]] = []  # (time, utilisation %, memory MiB)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Utilisation:
        if _smi("utilization.gpu") is not None:
            self._thread = threading.Thread(target=self._run, name="gpu-utilisation", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            rows = _smi("utilization.gpu", "memory.used")
            if rows:
                try:
                    util = sum(float(r[0]) for r in rows) / len(rows)
                    memory = sum(float(r[1]) for r in rows)
                except ValueError:  # "[N/A]"
                    pass
                else:
                    self.samples.append((time.time(), util, memory))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def over(self, start: float, end: float) -> dict | None:
        """Mean utilisation (percent), peak memory (MiB) and the number of samples between ``start`` and
        ``end`` (times from ``time.time()``); None without samples there."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if not inside:
            return None
        return {
            "gpu_util_pct": round(sum(s[1] for s in inside) / len(inside), 1),
            "memory_mib": max(s[2] for s in inside),
            "samples": len(inside),
        }


__all__ = ["Utilisation", "describe"]
