"""python -m pretrainlab.export <run or export dir> <out dir> [--format hf|native] [--force]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pretrainlab.export.hf import export_hf
from pretrainlab.export.native import ExportError, export_native


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pretrainlab.export",
        description=(
            "Export a pretrained encoder: --format hf writes a transformers directory (AutoModel.from_pretrained); "
            "--format native copies the pretrainlab export. The output directory is written in one rename; an earlier "
            "export of the same format there is replaced, any other non-empty directory is refused (--force replaces "
            "it). The working directory and the source are never replaced."
        ),
    )
    parser.add_argument("source", help="a pretraining run directory or its encoder/ export")
    parser.add_argument("out", help="the directory to write")
    parser.add_argument("--format", choices=["hf", "native"], default="hf")
    parser.add_argument("--force", action="store_true", help="replace a non-empty directory that is not an export")
    args = parser.parse_args(argv)
    write = export_hf if args.format == "hf" else export_native
    try:
        out = write(args.source, args.out, force=args.force)
    except (ExportError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shown = f"{args.out} (a link to {out})" if Path(args.out).is_symlink() else str(out)
    print(f"exported {args.source} -> {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
