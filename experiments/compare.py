"""Compare encoders: a table objective x task (mean ± std over seeds) with a GLUE score, as Markdown,
CSV and a PNG bar chart, and (unless --wandb disabled) a W&B run with the table. Every evaluation is a
column: GLUE's tasks, then NER, BLiMP (with blimp.md: by field, phenomenon and paradigm) and the
frozen-feature probes (with probes.md and probes.png: layer by layer).

    python experiments/compare.py runs/<run a>/glue runs/<run b>/glue runs/<run a>/glue-scratch
    python experiments/compare.py runs/studies/<study>            # every results file below it
    python experiments/compare.py wandb:<entity>/<project>        # the fine-tuning runs of a W&B project
    python experiments/compare.py runs/a runs/b --label runs/b=roberta-long   # name a source's encoder
    python experiments/compare.py runs/studies/<study> --baseline bert    # differences against a row, p-values

Each row is one kind of encoder: its objective (or scratch, hf:<name>), with the model preset when the
results span several. Pretraining seeds of one kind share its row and are reported as a second spread;
two different encoders that claim the same row and pretraining seed are refused (name them with --label),
and so are results of one task scored on different numbers of dev examples.

Every score comes with a 95% confidence interval (--ci t: the two-level t interval, right with few
seeds; --ci bootstrap: a hierarchical bootstrap, for twenty seeds or more; see pretrainlab/uncertainty.py).
--baseline ROW adds every other row minus that one, with its interval and the p-value of a paired test
over matched seeds; * marks a difference whose interval excludes zero. Results of encoder snapshots
(a study with snapshots=[...]) add curve.png / curve.csv: the GLUE score against pretraining FLOPs.

The conventions (task score, GLUE score) are written under the table; see src/pretrainlab/compare/.
"""

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sources", nargs="+", help="results directories/files, or wandb:<entity>/<project>")
    parser.add_argument("--out", default="comparison", help="output directory (default: ./comparison)")
    parser.add_argument(
        "--wandb",
        default="offline",
        choices=["offline", "online", "disabled"],
        help="log the table to W&B (default: offline, sync later with `wandb sync`)",
    )
    parser.add_argument("--project", default="pretrainlab", help="W&B project (default: pretrainlab)")
    parser.add_argument("--group", default=None, help="W&B group, e.g. the study's name")
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="SOURCE=NAME",
        help="name the encoder(s) of one source (a directory given above); repeatable",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="ROW",
        help="a row of the table (e.g. bert, scratch): report every other row's difference to it",
    )
    parser.add_argument(
        "--ci",
        default="t",
        choices=["t", "bootstrap"],
        help="confidence interval: two-level t (default) or hierarchical bootstrap",
    )
    parser.add_argument("--level", type=float, default=0.95, help="confidence level (default: 0.95)")
    args = parser.parse_args(argv)
    if not 0 < args.level < 1:
        parser.error(f"--level {args.level}: expected a number between 0 and 1, e.g. 0.95")

    from pretrainlab.compare import (  # here: --help answers without loading torch
        CompareError,
        collect,
        to_markdown,
        write_report,
    )
    from pretrainlab.runtime.wandb_runs import log_comparison

    labels = {}
    for item in args.label:
        source, sep, name = item.partition("=")
        if not sep or not name or source not in args.sources:
            parser.error(f"--label {item!r}: expected SOURCE=NAME with SOURCE one of the sources given")
        labels[source] = name
    out = Path(args.out)
    try:
        table = write_report(collect(args.sources, labels), out, args.baseline, args.ci, args.level)
    except (CompareError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(to_markdown(table))
    curve = ", curve.png, curve.csv" if table.get("curve") else ""
    print(f"\nwritten: {out}/comparison.md, comparison.csv, comparison.png, comparison.json{curve}")
    if args.wandb != "disabled":
        log_comparison(table, out, project=args.project, mode=args.wandb, group=args.group)
    return 0


if __name__ == "__main__":
    sys.exit(main())
