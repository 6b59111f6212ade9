"""What the reference tools' command lines share: their seeds and their output folder, checked
before any work starts."""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
from pathlib import Path


def seeds(text: str) -> list[int]:
    """``--seeds 0,1,2``: distinct non-negative integers (argparse ``type=``)."""
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. --seeds 0,1,2") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more non-negative integers, e.g. --seeds 0,1,2")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"{text!r} names a seed twice: each seed is one run; give each once")
    return values


def reference_parser(doc: str | None, example: str, kind: str) -> argparse.ArgumentParser:
    """The command line both reference tools share: the encoder, finetune.py overrides (``example``),
    ``--seeds``, ``--reference-only`` and ``--out`` (default ``runs/references/<kind>-<date>_<time>``)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pretrained", help="a pretraining run directory or its exported encoder")
    parser.add_argument("overrides", nargs="*", help=f"finetune.py overrides, e.g. {example}")
    parser.add_argument("--seeds", type=seeds, default="0", help="comma-separated fine-tuning seeds, each once")
    parser.add_argument("--reference-only", action="store_true", help="skip pretrainlab's side")
    parser.add_argument(
        "--out",
        help=f"a new directory for both sides' runs and results.csv (default: runs/references/{kind}-<date>_<time>)",
    )
    return parser


def output_dir(parser: argparse.ArgumentParser, out: str | None, kind: str) -> Path:
    """The tool's new output folder: ``--out`` (which must not hold files yet), else
    ``runs/references/<kind>-<date>_<time>``; created and checked writable now, before the export
    and the runs, so that a bad folder fails at once and nothing is left in a temporary directory."""
    path = Path(out) if out else Path("runs") / "references" / f"{kind}-{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}"
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        parser.error(f"--out {path} already holds files (an earlier check?): give a new directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        parser.error(f"--out {path}: cannot write there ({e.strerror or e}); give a folder you can write to")
    if not os.access(path, os.W_OK):
        parser.error(f"--out {path}: cannot write there; give a folder you can write to")
    return path
