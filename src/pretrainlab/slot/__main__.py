"""``python -m pretrainlab.slot pack | wheels | run | merge``: see ``pretrainlab.slot`` and docs/slot.md.
On a machine that lacks the project's dependencies, start ``run`` through ``experiments/slot.py``,
which installs them from the wheels that travelled with it first."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pretrainlab.runtime.hydra  # noqa: F401  (the resolvers the configs use)
from pretrainlab import atomic
from pretrainlab.config import ConfigError
from pretrainlab.slot.archive import MergeError, merge
from pretrainlab.slot.inputs import InputsError, pack
from pretrainlab.slot.report import recost, slot_markdown
from pretrainlab.slot.run import SlotArgs, compose_study, run_slot, with_earlier

log = logging.getLogger("pretrainlab")

# what an offline GPU node with torch, lightning, transformers, tokenizers, numpy, pandas, pyarrow and
# scipy lacks of what a slot imports (hydra's antlr4 runtime is published as a source distribution only)
NODE_LACKS = ("hydra-core", "omegaconf", "antlr4-python3-runtime")
# where ../shared/data keeps each block of evaluation data (an evaluation's `data`: glue, ner, blimp, ...)
SHARED_LAYOUT = {"glue": "glue", "ner": "conll2003", "blimp": "blimp", "squad": "squad"}


def positive(what: str):
    """An argparse ``type``: a finite number above 0, refused at the command line naming ``what``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: give {what}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{text}: give {what}, a finite number above 0")
        return value

    return parse


def seed_list(text: str) -> list[int]:
    """An argparse ``type``: one pretraining seed (``0``) or several (``0,1,2``), distinct, 0 or more."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give one seed (0) or several, comma-separated (0,1,2)") from None
    if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text}: pretraining seeds are distinct integers, 0 or more (0,1,2)")
    return seeds


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pretrainlab.slot", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    pack = sub.add_parser("pack", help="pack what the slot's study reads into one .tar.xz")
    pack.add_argument("--data", type=Path, help="a folder in ../shared/data's layout (corpus/, glue, blimp, conll2003)")
    pack.add_argument(
        "--corpus", type=Path, help="the pretraining corpus (.txt files; default <data>/corpus/gutenberg)"
    )
    pack.add_argument(
        "--data-dir",
        action="append",
        default=[],
        metavar="BLOCK=DIR",
        help="the folder of one block of evaluation data (glue=..., ner=..., blimp=...); default: in --data",
    )
    pack.add_argument("--out", type=Path, required=True, help="the archive to write (.tar.xz; never replaced)")
    pack.add_argument(
        "--max-mib",
        type=positive("the largest archive in MiB"),
        default=32.0,
        help="refuse an archive larger than this (MiB)",
    )
    pack.add_argument("overrides", nargs="*", help="conf/ablate_slot.yaml overrides, e.g. evals=[glue]")

    wheels = sub.add_parser("wheels", help="download the wheels an offline GPU node lacks (needs the package index)")
    wheels.add_argument("--out", type=Path, required=True, help="the folder to put them in")
    wheels.add_argument("--also", nargs="*", default=[], help="more requirements, e.g. matplotlib==3.11.2")

    run = sub.add_parser("run", help="run one slot: calibrate, plan, pretrain, evaluate, report, archive")
    run.add_argument("--inputs", type=Path, required=True, help="the archive `pack` wrote")
    run.add_argument("--out", type=Path, required=True, help="where the results archive goes")
    run.add_argument(
        "--seed",
        type=seed_list,
        help="the pretraining seed(s) of this slot: 0, or 0,1,2 for three in one start (default: the study's seeds)",
    )
    run.add_argument("--work", type=Path, help="the slot's working directory (default runs/slots/s<seeds>)")
    run.add_argument(
        "--minutes",
        type=positive("the whole command's time in minutes"),
        help="the whole command's time (default slot.minutes: 9)",
    )
    budget = run.add_mutually_exclusive_group()
    budget.add_argument(
        "--budget-flops",
        type=positive("pretraining FLOPs per objective, e.g. 2e15"),
        help="pretrain every objective to this; no calibration",
    )
    budget.add_argument("--plan-from", type=Path, help="the budget of an earlier slot's results archive")
    budget.add_argument(
        "--rates-from",
        type=Path,
        help="plan the largest budget for this slot's time from the throughput an earlier slot of the same runs "
        "measured on a device of the same name (its archive or slot.json); no calibration",
    )
    run.add_argument("--wheels", type=Path, help="(experiments/slot.py) where missing packages were installed from")
    run.add_argument("overrides", nargs="*", help="conf/ablate_slot.yaml overrides, e.g. model_size=tiny")

    render = sub.add_parser(
        "render", help="complete and write again a slot report's slot.json, slot.md and cost.md from its record"
    )
    render.add_argument(
        "report", type=Path, help="a slot's report folder (its slot.json), e.g. docs/results/gpu-slot-s0"
    )

    merge = sub.add_parser("merge", help="merge several slots' results archives into one report")
    merge.add_argument("archives", nargs="+", type=Path)
    merge.add_argument("--out", type=Path, required=True, help="a new study directory for the merged report")
    return p


def download_wheels(out: Path, also: list[str]) -> list[Path]:
    """The wheels of ``NODE_LACKS`` at the versions installed here (and ``also``) into ``out``."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"wheels: --out {out} is a file: give a folder (the wheels go into it).")
    out.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in NODE_LACKS]
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(out), *pins], check=True)
    if also:
        subprocess.run([*pip, "download", "-q", "--no-deps", "-d", str(out), *also], check=True)
    found = sorted(out.glob("*.whl"))
    log.info("wheels -> %s: %s", out, ", ".join(f.name for f in found))
    return found


def render(report: Path) -> None:
    """A slot's report written again by this code from its record: ``slot.json`` completed again
    (``run.with_earlier``: what a start pretrained, its rate), ``slot.md`` and ``cost.md`` (the slot's
    phases as its durations). For a report an older version of the code wrote; the measurements it
    holds are kept as they are."""
    path = report / "slot.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"render: {path} cannot be read as a slot's record ({e}): give a slot's report folder."
        ) from None
    record = with_earlier(record, record.pop("earlier", None) or [])
    atomic.write_json(path, record)
    atomic.write_text(report / "slot.md", slot_markdown(record) + "\n")
    starts = len(record.get("earlier") or []) + 1
    recost(report, [record], f"over its {starts} starts" if starts > 1 else "")
    log.info("rendered %s: slot.json, slot.md, cost.md", report)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, its Hydra overrides wherever they stand: ``+ablation=nsp --minutes 6 lr=1e-3``
    as well as all of them after the options (argparse alone takes one run of positionals)."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    stray = [x for x in extra if x.startswith("-") or "=" not in x]
    if stray or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    args = parse(argv)
    try:
        return _command(args)
    except (ConfigError, InputsError, MergeError) as e:  # refusals name their cause: no traceback to read
        print(f"slot {args.command}: {e}", file=sys.stderr)
        return 2


def _command(args: argparse.Namespace) -> int:
    if args.command == "pack":
        data = args.data
        corpus = args.corpus or (data / "corpus" / "gutenberg" if data else None)
        if corpus is None:
            raise SystemExit("pack: give --data (a folder in ../shared/data's layout) or --corpus and --data-dir.")
        dirs = {block: data / folder for block, folder in SHARED_LAYOUT.items() if data and (data / folder).is_dir()}
        for given in args.data_dir:
            block, _, folder = given.partition("=")
            if not folder:
                raise SystemExit(f"pack: --data-dir {given!r}: write BLOCK=DIR, e.g. glue=../shared/data/glue.")
            dirs[block] = Path(folder)
        cfg = compose_study(Path("inputs"), None, Path("runs/slots"), args.overrides)
        pack(cfg, args.out, corpus, dirs, args.max_mib)
    elif args.command == "wheels":
        download_wheels(args.out, args.also)
    elif args.command == "run":
        started = float(os.environ.get("PRETRAINLAB_SLOT_STARTED") or time.time())
        installed = json.loads(os.environ.get("PRETRAINLAB_SLOT_INSTALLED") or "{}")
        run_slot(
            SlotArgs(
                inputs=args.inputs,
                out=args.out,
                seeds=args.seed,
                work=args.work,
                minutes=args.minutes,
                budget_flops=args.budget_flops,
                plan_from=args.plan_from,
                rates_from=args.rates_from,
                overrides=list(args.overrides),
                started_at=started,
                installed=installed,
            )
        )
    elif args.command == "merge":
        merge(args.archives, args.out)
    elif args.command == "render":
        render(args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
