"""Recipe arms: several pretraining runs that differ by a few overrides, trained at once, and when
each head of each run left its trivial baseline.

A recipe question ("does NSP hold BERT's masked LM back?", "does pre-LN move the escape earlier?")
is answered by runs that share everything but what is asked, read at the same validations. An arms
file names them::

    # experiments/arms/bert_pair_loss.yaml
    about: What holds BERT's masked LM on its plateau where RoBERTa's leaves it
    common: [model=tiny, max_steps=6000, val_every=500, logger=csv]
    arms:
      roberta: [objective=roberta]
      bert: [objective=bert]
      bert-pair0: [objective=bert, objective.pair_weight=0]

    python experiments/arms.py experiments/arms/bert_pair_loss.yaml --out runs/arms/bert \\
        --jobs 2 data=packed data.path=<corpus>        # more common overrides after the file

Every arm is ``train.py`` composed from ``common``, the command line's overrides and its own, in its
own directory (``<out>/runs/<arm>``), ``--jobs`` at a time (``studies.parallel``: one process each, an
equal share of the cores). ``--minutes`` stops every run still training at that time, as Ctrl-C does
(each saves its checkpoint), and the report is written from what they validated; running the same
command again resumes them. The report (``<out>/report``, as ``docs publish`` takes it):

- ``report.json``/``report.md``: per arm and head, the first validation at which the head was above
  and past its baseline (step and FLOPs), its last value beside the baseline, and the encoder's
  state at the end (mean cosine of its final hidden states over held-out tokens; for masked heads,
  the distinct answers at [MASK]): a run still at its baseline with distinct answers is starting
  slowly, one whose tokens all look alike has collapsed;
- ``curves.csv``: every validation of every arm (step, tokens, FLOPs, each head's value, baseline
  and verdict).
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import math
import re
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic
from pretrainlab.compare.measurements import write_table_report
from pretrainlab.objectives.learning import ABOVE, PAST
from pretrainlab.pretraining.learning_log import FILE as LEARNING
from pretrainlab.pretraining.learning_log import heads, read_rows
from pretrainlab.runtime.hydra import compose
from pretrainlab.runtime.provenance import typed_command
from pretrainlab.runtime.script import rerun_command
from pretrainlab.runtime.signals import TimeUp, deadline, exit_on_signal
from pretrainlab.studies.parallel import check_jobs, pretraining_work, run_parallel

log = logging.getLogger("pretrainlab")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+=-]*$")
MAX_NAME = 64  # a W&B tag's length
FILE = "arms.json"  # what the runs of an --out were made from: the same command continues them


class ArmsError(ValueError):
    """An arms file or command line that cannot be run: what is wrong and how to fix it."""


def load_arms(path: Path) -> tuple[str, list[str], dict[str, list[str]]]:
    """(about, common overrides, {arm: its overrides}) of an arms file, checked."""
    if not path.is_file():
        raise ArmsError(f"{path}: no such arms file (experiments/arms/ holds examples).")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:  # a YAML error names the line
        raise ArmsError(f"{path} is not readable YAML: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("arms"), dict) or not raw["arms"]:
        raise ArmsError(f"{path}: give `arms:`, a mapping of arm names to lists of train.py overrides.")
    unknown = set(raw) - {"about", "common", "arms"}
    if unknown:
        raise ArmsError(f"{path}: unknown key(s) {sorted(unknown)}; an arms file has about, common and arms.")
    common = raw.get("common") or []
    arms: dict[str, list[str]] = {}
    for name, overrides in raw["arms"].items():
        if not isinstance(name, str) or not NAME.match(name) or name in (".", "..") or len(name) > MAX_NAME:
            raise ArmsError(
                f"{path}: arm name {name!r} is not a safe folder name and W&B tag: 1 to {MAX_NAME} letters, digits, "
                f"_ . + = -."
            )
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise ArmsError(f"{path}: arm {name!r} must be a list of train.py overrides, e.g. [objective=bert].")
        arms[name] = list(overrides)
    if not isinstance(common, list) or not all(isinstance(o, str) for o in common):
        raise ArmsError(f"{path}: `common` must be a list of train.py overrides.")
    return str(raw.get("about") or ""), list(common), arms


def compose_arms(common: list[str], arms: dict[str, list[str]]) -> dict[str, tuple[DictConfig, dict[str, str]]]:
    """Every arm's composed train.py config (and group choices); two arms that compose the same
    config are refused, naming both."""

    composed: dict[str, tuple[DictConfig, dict[str, str]]] = {}
    seen: dict[str, str] = {}
    for name, own in arms.items():
        try:
            cfg, choices = compose("train", [*common, *own])
        except Exception as e:
            raise ArmsError(f"arm {name!r} ({' '.join([*common, *own])}) does not compose: {e}") from None
        key = OmegaConf.to_yaml(cfg, resolve=False)
        if key in seen:
            raise ArmsError(
                f"arms {seen[key]!r} and {name!r} compose the same run: an arm must change something "
                f"({own or 'no overrides'})."
            )
        seen[key] = name
        composed[name] = (cfg, choices)
    return composed


DONE = "arm-done.json"  # in a run's directory once it trained to its end


def _number(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def first(rows: list[dict[str, str]], head: str, statuses: tuple[str, ...]) -> dict[str, str] | None:
    """The first validation from which the head's verdict stays in ``statuses`` to the end (a study's
    ``learning-curves.md`` gives the first validation past it, even one it fell back from)."""
    found = None
    for row in rows:
        if row.get(f"status:{head}") in statuses:
            found = found or row
        else:
            found = None
    return found


def summary_rows(arms: dict[str, list[str]], curves: dict[str, list[dict[str, str]]]) -> list[list[str]]:
    """One row per arm and head: when it went above and past its baseline, where it ended."""

    def when(row: dict[str, str] | None) -> str:
        if row is None:
            return "-"
        return f"{int(row['step']):,} ({_number(row['flops']):.1e})"

    out = []
    for arm, rows in curves.items():
        if not rows:
            out.append([arm, " ".join(arms[arm]), "(no validation yet)", "", "", "", "", "", "", ""])
            continue
        last = rows[-1]
        cosine = _number(last.get("hidden_cosine"))
        for head in heads(last):
            prefix = (last.get(f"metric:{head}") or "").removesuffix("_acc_at_mask")
            distinct = _number(last.get(f"{prefix}_distinct_answers"))
            out.append(
                [
                    arm,
                    " ".join(arms[arm]),
                    head,
                    when(first(rows, head, (ABOVE, PAST))),
                    when(first(rows, head, (PAST,))),
                    f"{int(last['step']):,} ({_number(last['flops']):.1e})",
                    f"{_number(last[f'value:{head}']):.3f} vs {_number(last[f'baseline:{head}']):.3f}",
                    last[f"status:{head}"],
                    "-" if math.isnan(cosine) else f"{cosine:.2f}",
                    "-" if math.isnan(distinct) else f"{int(distinct):,}",
                ]
            )
    return out


def curves_csv(curves: dict[str, list[dict[str, str]]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["arm", "step", "tokens", "flops", "head", "value", "baseline", "status", "hidden_cosine"])
    for arm, rows in curves.items():
        for row in rows:
            for head in heads(row):
                writer.writerow(
                    [
                        arm,
                        row["step"],
                        row["tokens"],
                        row["flops"],
                        head,
                        row[f"value:{head}"],
                        row[f"baseline:{head}"],
                        row[f"status:{head}"],
                        row.get("hidden_cosine", ""),
                    ]
                )
    return out.getvalue()


COLUMNS = [
    "arm",
    "overrides",
    "head",
    "above from (step, FLOPs)",
    "past from (step, FLOPs)",
    "last validation",
    "last value vs baseline",
    "verdict",
    "hidden cosine",
    "distinct answers",
]


def write_report(out: Path, about: str, arms: dict[str, list[str]], common: list[str]) -> Path:

    curves = {arm: read_rows(out / "runs" / arm / LEARNING) for arm in arms if (out / "runs" / arm).is_dir()}
    report = out / "report"
    text = (
        f'{about} Common to every arm: `{typed_command(" ".join(common))}`. "Above/past from": the first validation '
        f"from which the head stayed above (past) its trivial baseline to the last one; hidden cosine: "
        f"the mean cosine between the encoder's final hidden states at held-out tokens (near 1: every "
        f"token looks alike); distinct answers: the different tokens a masked head answers at [MASK]."
    ).strip()
    write_table_report(
        report, "Recipe arms: when each head left its baseline", COLUMNS, summary_rows(arms, curves), text
    )
    atomic.write_text(report / "curves.csv", curves_csv(curves))
    return report


def check_out(out: Path, report_only: bool) -> None:
    """``--out``, before anything is written: a new or empty folder, or one an arms run made
    (``arms.json``), never a file or a folder of other files; with ``--report-only``, one with runs."""
    if out.exists() and not out.is_dir():
        raise ArmsError(f"--out {out} is a file: give a folder for the arms' runs and report.")
    made = (out / FILE).is_file()
    if out.is_dir() and not made and any(out.iterdir()):
        raise ArmsError(
            f"--out {out} holds files an arms run did not make (it has no {FILE}): give a new or empty folder, "
            f"so that nothing there is overwritten."
        )
    if report_only and not (made and any((out / "runs").glob("*/" + LEARNING))):
        raise ArmsError(
            f"--report-only: {out} holds no arms run that validated (no runs/<arm>/{LEARNING}): nothing to report. "
            f"Run the arms first (without --report-only)."
        )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python experiments/arms.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("arms", type=Path, help="an arms file (experiments/arms/*.yaml)")
    p.add_argument("overrides", nargs="*", help="train.py overrides common to every arm, after the file's")
    p.add_argument("--out", type=Path, required=True, help="the folder of the arms' runs and report")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (one process each)")
    p.add_argument("--only", default="", help="comma-separated arms to run (default: all)")
    p.add_argument("--minutes", type=float, help="stop the runs still training after this long; report what they did")
    p.add_argument("--report-only", action="store_true", help="write the report from the runs there, train nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    import json

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    import pretrainlab.runtime.hydra  # noqa: F401  (the resolvers the configs use)

    try:
        about, common, arms = load_arms(args.arms)
        if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
            raise ArmsError(f"--minutes {args.minutes}: give a positive, finite number of minutes.")
        check_out(args.out, args.report_only)
        only = [a for a in args.only.split(",") if a]
        missing = [a for a in only if a not in arms]
        if missing:
            raise ArmsError(f"--only {','.join(missing)}: not an arm of {args.arms} (its arms: {', '.join(arms)}).")
        common = [*common, *args.overrides]
        composed = compose_arms(common, arms)
        jobs = check_jobs(args.jobs, [c for c, _ in composed.values()])
        record = {"arms": arms, "common": common}
        recorded = args.out / FILE
        if recorded.is_file() and json.loads(recorded.read_text()) != record:
            raise ArmsError(
                f"{args.out} holds arms run with other settings ({recorded}): give another --out, or the "
                f"same arms file and overrides to continue them."
            )
    except ArmsError as e:
        parser.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(args.out / FILE, json.dumps(record, indent=2))
    if not args.report_only:
        work = []
        for name, (cfg, choices) in composed.items():
            if only and name not in only:
                continue
            run_dir = args.out / "runs" / name
            if (run_dir / DONE).is_file():
                log.info("arm %s: trained already (%s)", name, run_dir)
                continue
            if (run_dir / "checkpoints").is_dir():
                cfg.ckpt_path = "auto"
            log_path = args.out / "logs" / f"{name}.log"
            work.append(pretraining_work(run_dir, cfg, choices, log_path, checks="none", done=DONE, name=f"arm {name}"))
        started = time.time()
        limit = deadline(started + 60 * args.minutes, lambda: "--minutes ran out") if args.minutes else nullcontext()
        try:
            with limit, exit_on_signal("the arms", rerun_command()):
                run_parallel(work, jobs, rerun_command())
        except KeyboardInterrupt:  # every run got one SIGTERM from run_parallel: each saved its checkpoint
            log.warning(
                "Ctrl-C: the arms stopped (each run saved its checkpoint). Continue them with:\n  %s", rerun_command()
            )
            return 130
        except TimeUp:
            log.warning(
                "--minutes %g ran out after %.0f s: the runs were stopped; reporting what they validated",
                args.minutes,
                time.time() - started,
            )
    report = write_report(args.out, about, arms, common)
    print((report / "report.md").read_text())
    return 0


__all__ = ["ArmsError", "compose_arms", "first", "load_arms", "main", "summary_rows", "write_report"]
