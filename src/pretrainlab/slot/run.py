"""One slot, start to end (``python experiments/slot.py run``, docs/slot.md):

    unpack      the inputs archive, every file checked against its digest
    calibrate   every objective's pretraining started at once, timed together and alone (``calibrate``)
    plan        the time left, less what evaluation and the report keep, turned into one FLOP budget
                for every objective (``plan``); or the budget given (``--budget-flops``, ``--plan-from``),
                or planned from an earlier slot's calibration of the same runs (``--rates-from``)
    study       ``studies.ablation.run_study`` at that budget: every pretraining run at once, every
                encoder's evaluation suite at once, the report
    account     ``report/slot.json`` and ``slot.md``: the plan against what happened, phase by phase,
                the device's utilisation, the jobs' aggregate throughput at once against one after another
    archive     ``<out>/<study>-s<seed>.tar.gz``: the results without weights (``archive``)

The archive is written whatever happens, a failure included (its ``slot.json`` then says what
failed), so that a slot always brings back what it learned. The slot keeps to its time: when its
``--minutes`` are up, less what writing the archive keeps (``slot.reserve_s.report``), the work in
progress is stopped (``TimeUp``) and the archive says in which phase. Re-running the same command with the
same ``--work`` continues a slot that was stopped: the budget it planned is kept, finished runs and
results are skipped (the study's own resumption).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shlex
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic
from pretrainlab.config import ConfigError
from pretrainlab.runtime import mps
from pretrainlab.runtime.console import quiet_third_parties
from pretrainlab.runtime.hydra import compose
from pretrainlab.runtime.provenance import typed_command
from pretrainlab.runtime.settings import uses_cuda
from pretrainlab.runtime.signals import TimeUp, deadline
from pretrainlab.slot.archive import differences, write_archive
from pretrainlab.slot.calibrate import plan_rates, throughput
from pretrainlab.slot.code import code_version
from pretrainlab.slot.device import Utilisation, describe
from pretrainlab.slot.inputs import digest, unpack
from pretrainlab.slot.plan import largest_budget
from pretrainlab.slot.report import recost, slot_markdown
from pretrainlab.studies import ablation
from pretrainlab.studies.arms import check_arm_names, pretraining_config, study_arms
from pretrainlab.studies.parallel import measure_work, run_parallel
from pretrainlab.studies.throughput import Windows, read_rates

log = logging.getLogger("pretrainlab")

# study settings that say where things are or how fast they go, not what the experiment is
HOW = (
    "seeds",
    "output_root",
    "corpus",
    "glue_dir",
    "blimp_dir",
    "conll_dir",
    "data_dirs",
    "budget_flops",
    "jobs",
    "mps",
    "fuse_pretraining",
    "fuse_finetuning",
    "slot",
)
# study settings that decide what the evaluations and the report do, not what a pretraining job computes:
# another slot's throughput is this slot's when all the other settings are the same (``--rates-from``)
NOT_PRETRAINING = (
    "study",
    "about",
    "suite",
    "glue",
    "evals",
    "baseline",
    "scratch",
    "intrinsic",
    "launcher",
    "detach",
    "slurm",
)


@dataclass
class SlotArgs:
    inputs: Path
    out: Path
    seeds: list[int] | None = None  # the pretraining seeds of this slot (None: the study's ``seeds``)
    work: Path | None = None
    minutes: float | None = None
    budget_flops: float | None = None
    plan_from: Path | None = None
    rates_from: Path | None = None  # an earlier slot (archive or slot.json) whose calibration this slot plans from
    overrides: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    installed: dict = field(default_factory=dict)


class Timeline:
    """When each phase of the slot started (``time.time()``), in order."""

    def __init__(self, start: float):
        self.start = start
        self.marks: list[tuple[str, float]] = [("setup", start)]  # the command's start: installing, imports

    def mark(self, phase: str) -> None:
        self.marks.append((phase, time.time()))
        log.info("slot: %s (%.0f s in)", phase, self.marks[-1][1] - self.start)

    def phases(self) -> dict[str, dict[str, float]]:
        """Each phase's start (seconds into the slot), length and end time."""
        out = {}
        for (name, t), (_, nxt) in zip(self.marks, self.marks[1:]):
            if name == "end":
                continue
            out[name] = {"from_s": round(t - self.start, 1), "seconds": round(nxt - t, 1), "at": t, "until": nxt}
        return out


@contextlib.contextmanager
def time_limit(at: float, timeline: Timeline, minutes: float, kept_s: float) -> Iterator[None]:
    """Raise :class:`TimeUp` in this thread at ``at`` (``time.time()``), naming the phase it stops."""

    def message() -> str:
        return (
            f"the slot's {minutes:g} minutes ran out (less {kept_s:g} s kept for its archive) during its "
            f"{timeline.marks[-1][0]} phase; the work in progress was stopped and what finished is in this "
            f"archive. Give the slot more time (--minutes) or less work (objectives, suite.glue_tasks, suite.seeds)."
        )

    with deadline(at, message):
        yield


def compose_study(inputs: Path, seeds: list[int] | None, work: Path, overrides: list[str]) -> DictConfig:
    """The slot's study config: ``conf/ablate_slot.yaml`` with ``overrides``, its pretraining ``seeds``
    (None: the study's own), its directories under ``work``, its data from the unpacked ``inputs``;
    ``jobs: all`` made the number of encoders it evaluates (every run, and the scratch baseline), so
    that every pretraining run trains at once, as the slot's plan assumes."""

    check_arm_names(overrides)
    located = [f"output_root={work}", f"corpus={inputs / 'corpus'}"]
    if seeds is not None:
        located.insert(0, f"seeds=[{','.join(map(str, seeds))}]")
    # every other folder of the inputs holds one block of evaluation data (inputs.pack): glue, ner, blimp, ...
    blocks = sorted(d.name for d in inputs.iterdir() if d.is_dir() and d.name != "corpus") if inputs.is_dir() else []
    located += [f'++data_dirs.{block}="{inputs / block}"' for block in blocks]
    cfg, _ = compose("ablate_slot", [*overrides, *located])
    if cfg.get("jobs") == "all":
        cfg.jobs = len(study_arms(cfg)) * len(cfg.seeds) + (1 if cfg.get("scratch") else 0)
    return cfg


def study_seeds(overrides: list[str]) -> list[int]:
    """The pretraining seeds of the slot's study as configured (``seeds`` in conf/ablate_slot.yaml, an
    ablation preset or the command line), checked: distinct integers, 0 or more."""
    cfg, _ = compose("ablate_slot", list(overrides))
    seeds = cfg.get("seeds")
    if OmegaConf.is_list(seeds):
        seeds = list(seeds)
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise ConfigError(
            f"seeds={seeds!r}: the slot's pretraining seeds are a list of distinct integers, 0 or more (seeds=[0,1,2] "
            f"or --seed 0,1,2)."
        )
    return seeds


def seeds_label(seeds: list[int]) -> str:
    """How a slot's folders and archive name its pretraining seeds: s0, s0-1-2."""
    return "s" + "-".join(map(str, seeds))


def settings(cfg: DictConfig) -> dict:
    """What the experiment is: the study's config as written (interpolations unresolved), without
    where its files are or how fast it runs (``HOW``)."""
    container = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(container, dict)
    return {k: v for k, v in container.items() if k not in HOW}


def slot_record(path: Path, option: str) -> dict:
    """The record (``report/slot.json``) of an earlier slot: in its results archive, or the file itself
    (a published report's ``slot.json`` or ``slot-<archive>.json``); refused naming ``option``."""
    import tarfile

    try:
        if path.suffix == ".json":
            record = json.loads(path.read_text())
        else:
            with tarfile.open(path, "r:gz") as tar:
                member = next((m for m in tar.getmembers() if m.name.endswith("/report/slot.json")), None)
                f = tar.extractfile(member) if member is not None else None
                record = json.loads(f.read()) if f is not None else None
    except (tarfile.TarError, OSError, ValueError) as e:
        raise ConfigError(f"{option} {path}: cannot be read as a slot's results archive or slot.json ({e}).") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{option} {path}: it holds no slot's record (report/slot.json): give a slot's archive.")
    return record


def _budget_of(archive: Path) -> float:
    budget = (slot_record(archive, "--plan-from").get("plan") or {}).get("budget_flops")
    if not budget:
        raise ConfigError(f"--plan-from {archive}: it records no FLOP budget (did that slot fail before planning?).")
    try:
        value = float(budget)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"--plan-from {archive}: its report/slot.json records a budget of {budget!r}, not a number of FLOPs "
            f"above 0: the archive was edited or damaged. Give another slot's archive, or --budget-flops."
        )
    return value


def rates_from(path: Path, cfg: DictConfig, seeds: list[int], device: dict) -> dict:
    """The calibration of the earlier slot at ``path`` as this slot's: every job's measurement, named as
    this slot's jobs (an arm's run of the i-th seed there is its run of the i-th seed here), with where it
    was measured. Refused unless that slot calibrated the same pretraining runs, as many at once, on a
    device of the same name: its throughput is then what this slot's calibration would measure."""
    record = slot_record(path, "--rates-from")
    measured = (record.get("plan") or {}).get("measured")
    fix = "calibrate in this slot (leave out --rates-from), or give the archive of a slot that calibrated these runs"
    if not isinstance(measured, dict) or not measured:
        source = (record.get("plan") or {}).get("source") or "no plan"
        raise ConfigError(f"--rates-from {path}: that slot did not calibrate (its budget: {source}): {fix}.")
    there, here = (record.get("device") or {}), device
    if (there.get("device"), there.get("gpus")) != (here.get("device"), here.get("gpus")):
        raise ConfigError(
            f"--rates-from {path}: its throughput was measured on {there.get('device', '?')}, and this slot runs on "
            f"{here.get('device', '?')}: {fix}."
        )
    mine = {k: v for k, v in settings(cfg).items() if k not in NOT_PRETRAINING}
    theirs = {k: v for k, v in (record.get("settings") or {}).items() if k not in NOT_PRETRAINING}
    differ = differences(theirs, mine)
    if differ:
        raise ConfigError(
            f"--rates-from {path}: its pretraining runs are not this slot's ({'; '.join(differ[:4])}): {fix}."
        )
    their_seeds = [int(s) for s in record.get("seeds") or []]
    if len(their_seeds) != len(seeds):
        raise ConfigError(
            f"--rates-from {path}: it trained {len(their_seeds)} pretraining seed(s) at once and this slot trains "
            f"{len(seeds)}, so its runs shared the device with another number of runs: {fix}."
        )
    untimed = sorted(j for j, m in measured.items() if not all(k in m for k in ("setup_s", "sanity_s", "warm_after_s")))
    if untimed:
        raise ConfigError(
            f"--rates-from {path}: its calibration did not record how long {', '.join(untimed)} took to start and "
            f"compile (setup_s, sanity_s, warm_after_s), which this slot's plan needs: {fix}."
        )
    arms = list(study_arms(cfg))
    out = {}
    for arm in arms:
        for i, seed in enumerate(seeds):
            theirs_job = calibration_job(arm, their_seeds[i], their_seeds)
            if theirs_job not in measured:
                raise ConfigError(f"--rates-from {path}: its calibration has no job {theirs_job}: {fix}.")
            out[calibration_job(arm, seed, seeds)] = {**measured[theirs_job], "job": calibration_job(arm, seed, seeds)}
    return {
        "measured": out,
        "mps": bool((record.get("mps") or {}).get("running")),
        "evaluation_s": ((record.get("phases") or {}).get("evaluation") or {}).get("seconds"),
        "slot": {
            "from": path.name,
            "started": record.get("started"),
            "device": there.get("device"),
            "code": (record.get("code") or {}).get("digest"),
        },
    }


def calibration_job(arm: str, seed: int, seeds: list[int]) -> str:
    """The calibration's job of ``arm``'s run of ``seed``: the arm's name (roberta) in a slot of one seed,
    the run's (roberta-s1) in a slot of several."""
    return arm if len(seeds) == 1 else f"{arm}-s{seed}"


def calibration_jobs(arms: list[str], seeds: list[int]) -> dict[str, str]:
    """The calibration's jobs, one per pretraining run in the order the study starts them (seed by seed),
    each mapped to the job of its arm's first seed, the one timed alone for it."""
    return {calibration_job(arm, seed, seeds): calibration_job(arm, seeds[0], seeds) for seed in seeds for arm in arms}


def alone_as_first(measured: dict[str, dict], first: dict[str, str]) -> dict[str, dict]:
    """Every job's measurement with its time alone: a run of another seed is the run of its arm's first
    seed but for its seed, as fast alone (``alone_from`` names the job timed)."""
    out = dict(measured)
    for job, timed in first.items():
        if job != timed and "alone" in measured[timed]:
            out[job] = {**measured[job], "alone": measured[timed]["alone"], "alone_from": timed}
    return out


def calibrate(cfg: DictConfig, study: Path, deadline: float, timeline: Timeline) -> dict:
    """Time every pretraining job of the study (``calibrate``) and plan the budget (``plan``)."""

    timeline.mark("calibration")
    c = cfg.slot.calibration
    exchange = study / "calibration" / time.strftime("%Y%m%d-%H%M%S")
    exchange.mkdir(parents=True)
    probe = cfg.copy()
    probe.budget_flops = 1.0  # replaced by a step count in each job: the budget is what calibration is for
    # every pretraining run is timed, all at once as the study will train them: one job per arm (an arm per
    # objective, unless arms are given), named after it; with several seeds, one per arm and seed (roberta-s1)
    arms, seeds = list(study_arms(cfg)), [int(s) for s in cfg.seeds]
    first = calibration_jobs(arms, seeds)  # job -> the job of its arm's first seed, which is timed alone for it
    work, names = [], {}
    for arm, seed in ((arm, seed) for seed in seeds for arm in arms):
        job = calibration_job(arm, seed, seeds)
        train_cfg, _ = pretraining_config(probe, arm, seed)
        name = f"calibrating {job}"
        names[name] = job
        kwargs = {
            "job": job,
            "exchange": str(exchange),
            "warmup_steps": int(c.warmup_steps),
            "timeout_s": float(c.timeout_s),
            "spawned_at": time.time(),
            "run_dir": str(exchange / job),
        }
        work.append(measure_work(name, train_cfg, kwargs, exchange / f"{job}.log"))
    windows = Windows(exchange, names, float(c.together_s), float(c.alone_s), alone=set(first.values()))
    run_parallel(work, len(work), " ".join(sys.argv), tick=windows)
    measured = alone_as_first(read_rates(exchange, list(first)), first)
    timeline.mark("plan")
    startup = max(m["setup_s"] for m in measured.values()) + float(cfg.slot.startup_s)
    return {**plan_budget(cfg, measured, deadline, startup), "source": "calibrated", "windows": windows.written}


def plan_budget(cfg: DictConfig, measured: dict[str, dict], deadline: float, startup: float) -> dict:
    """The largest equal budget for the study's runs in the time left before ``deadline`` (less what
    evaluation and the report keep), from each job's measured throughput (``plan``), each run starting
    ``startup`` seconds into the pretraining phase; refused when no budget fits."""
    rates = plan_rates(measured)
    reserve = cfg.slot.reserve_s
    window = deadline - time.time() - float(reserve.evaluation) - float(reserve.report)
    try:
        plan = largest_budget(rates, window, startup, float(cfg.slot.finish_s), float(cfg.slot.safety))
    except ValueError as e:
        raise ConfigError(
            f"the slot cannot pretrain in the time it has: {e}. Give it more (--minutes), keep less for evaluation "
            f"(slot.reserve_s.*), or fewer objectives."
        ) from None
    speed = throughput(measured, plan.budget_flops)
    log.info(
        "plan: %.2g FLOPs per objective in a window of %.0f s (the last run expected to end %.0f s in); at once, "
        "%.2f TFLOP/s against %s one after another",
        plan.budget_flops,
        window,
        plan.makespan_s,
        speed["together"]["flops_per_s"] / 1e12,
        f"{speed['one_after_another']['flops_per_s'] / 1e12:.2f} TFLOP/s" if "one_after_another" in speed else "?",
    )
    return {
        "budget_flops": plan.budget_flops,
        "window_s": round(window, 1),
        "startup_s": round(startup, 1),
        "finish_s": float(cfg.slot.finish_s),
        "safety": float(cfg.slot.safety),
        "planned_end_s": {k: round(v, 1) for k, v in plan.finish_s.items()},
        "rates": {k: {"together": r.together, "alone": r.alone} for k, r in rates.items()},
        "measured": measured,
        "throughput": speed,
    }


def plan_from_rates(cfg: DictConfig, earlier: dict, deadline: float, timeline: Timeline) -> dict:
    """The budget planned from an earlier slot's calibration (``rates_from``), without one here: every run
    then compiles in the pretraining phase with cold caches, so each starts after what a calibration job
    took to get warm there (its setup, validation step, compile and warm-up steps)."""
    timeline.mark("plan")
    measured = earlier["measured"]
    startup = max(m["setup_s"] + m["sanity_s"] + m["warm_after_s"] for m in measured.values())
    kept = float(cfg.slot.reserve_s.evaluation)
    if earlier.get("evaluation_s") is not None:
        log.info(
            "plan: the slot the rates come from evaluated in %.0f s; this one keeps %.0f s for it (slot.reserve_s.evaluation)",
            earlier["evaluation_s"],
            kept,
        )
    plan = plan_budget(cfg, measured, deadline, startup)
    source = earlier["slot"]
    return {
        **plan,
        "source": f"planned from the throughput measured in the calibration of {source['from']} (--rates-from)",
        "measured_in": source,
    }


def _runs_as_run(study: Path, phases: dict) -> dict:
    """Each pretraining run as it ran: steps, tokens, FLOPs, seconds of training steps, and when its
    export and its held-out checks were written (seconds after the pretraining phase started)."""
    start = (phases.get("pretraining") or {}).get("at")
    out = {}
    for run in sorted((study / "pretrain").glob("*")):
        config = run / "encoder" / "config.json"
        if not config.is_file():
            continue
        record = json.loads(config.read_text()).get("pretraining") or {}
        out[run.name] = {
            "objective": record.get("objective"),
            "steps": record.get("global_step"),
            "tokens": record.get("tokens_seen"),
            "flops": record.get("flops"),
            "train_s": record.get("seconds"),
            "exported_s": round(config.stat().st_mtime - start, 1) if start else None,
        }
        checks = run / "intrinsic.json"  # written by the run's process after its export: the run's end
        if start and checks.is_file():
            out[run.name]["done_s"] = round(checks.stat().st_mtime - start, 1)
    return out


def earlier_starts(report: Path) -> list[dict]:
    """The records of the starts before this one of a slot being continued: a ``report/slot.json`` that
    did not finish (with the starts before it), or none."""
    try:
        record = json.loads((report / "slot.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(record, dict) or not record.get("error"):
        return []
    earlier = record.pop("earlier", None) or []
    record.pop("settings", None)  # the same study: its settings are the slot's own
    return [*earlier, record]


def with_earlier(record: dict, earlier: list[dict]) -> dict:
    """``record`` completed with its pretraining throughput and, for a start that continued a slot,
    its ``earlier`` starts: this start's throughput counts only the runs it pretrained (none: no
    throughput), and a run pretrained in an earlier start is reported as it ran there."""
    runs = record.get("runs") or {}
    before = [name for name, r in runs.items() if not _pretrained_here(r)]
    trained = [r for name, r in runs.items() if name not in before]
    seconds = float(((record.get("phases") or {}).get("pretraining") or {}).get("seconds") or 0)
    record.pop("pretraining_throughput", None)  # a rate over a phase that trained nothing is not a rate
    if trained and seconds > 0:
        record["pretraining_throughput"] = {
            "tokens_per_s": sum(float(r["tokens"] or 0) for r in trained) / seconds,
            "flops_per_s": sum(float(r["flops"] or 0) for r in trained) / seconds,
        }
    if earlier:
        record["earlier"] = earlier
    for name in before:
        for k in range(len(earlier) - 1, -1, -1):
            then = (earlier[k].get("runs") or {}).get(name)
            if then and then.get("exported_s") is not None and then["exported_s"] >= 0:
                runs[name] = {**then, "start": k + 1}
                break
        else:  # pretrained before this start, in none that recorded it
            runs[name] = {**runs[name], "exported_s": None, "done_s": None}
    return record


def account(record: dict, timeline: Timeline, utilisation: Any, study: Path, earlier: list[dict] | None = None) -> dict:
    """The slot's record completed with what happened: phases with the device's utilisation, each run
    as it ran, the pretraining phase's aggregate throughput; for a slot continued, its ``earlier``
    starts (``with_earlier``)."""
    if timeline.marks[-1][0] != "end":
        timeline.mark("end")
    phases = timeline.phases()
    for p in phases.values():
        p["utilisation"] = utilisation.over(p["at"], p["until"])
    record["phases"] = {k: {kk: vv for kk, vv in v.items() if kk not in ("at", "until")} for k, v in phases.items()}
    record["wall_s"] = round(time.time() - timeline.start, 1)
    record["runs"] = _runs_as_run(study, phases)
    windows = (record.get("plan") or {}).get("windows")
    if windows:
        together = windows["together"]
        alone = list(windows["alone"].values())
        record.setdefault("plan", {})["utilisation"] = {
            "together": utilisation.over(*together),
            "alone": utilisation.over(alone[0][0], alone[-1][1]) if alone else None,
        }
    return with_earlier(record, earlier or [])


def _pretrained_here(run: dict) -> bool:
    """Whether a run of this start's record was pretrained in this start: not exported before its
    pretraining phase began (a negative time into it), and not already reported as an earlier start's
    (``start``: a record completed once, read again)."""
    return run.get("start") is None and (run.get("exported_s") is None or run["exported_s"] >= 0)


def finished(record: Path) -> bool:
    """Whether ``record`` (a study's ``report/slot.json``) is that of a slot that finished."""
    try:
        return record.is_file() and not json.loads(record.read_text()).get("error")
    except ValueError:
        return False


def check_work_seed(study: Path, seeds: list[int]) -> None:
    """Refuse a slot's work folder that holds a slot of other pretraining seeds: its record would be
    replaced and its runs would travel in this slot's archive (one slot per --work)."""
    others: set[int] = set()
    try:
        others |= {int(s) for s in json.loads((study / "report" / "slot.json").read_text()).get("seeds") or []}
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    for run in (study / "pretrain").glob("*-s*"):
        tail = run.name.rsplit("-s", 1)[1]
        if tail.isdigit():
            others.add(int(tail))
    others -= set(seeds)
    if others:
        asked = ", ".join(map(str, seeds))
        raise ConfigError(
            f"--work {study.parent} holds the slot of pretraining seed {', '.join(map(str, sorted(others)))} ({study}): "
            f"a slot of seed {asked} there would replace its record and carry its runs in this slot's archive. Give "
            f"each slot its own --work (the default is runs/slots/s<seeds>)."
        )


def run_slot(a: SlotArgs) -> Path:
    """Run the slot ``a`` describes; returns its results archive (written also when the slot fails)."""

    seeds = list(a.seeds) if a.seeds is not None else study_seeds(a.overrides)
    label = seeds_label(seeds)
    work = (a.work or Path("runs") / "slots" / label).expanduser().resolve()
    for option, folder in (("--out", a.out), ("--work", work)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"{option} {folder}: cannot be made a folder ({e.strerror or e}); give a folder path."
            ) from None
    quiet_third_parties()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(work / "cache" / "inductor"))  # shared by every job
    os.environ.setdefault("PRETRAINLAB_CACHE", str(work / "cache" / "pretrainlab"))
    timeline = Timeline(a.started_at)
    utilisation = Utilisation().start()
    work.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(work / "slot.log")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    logging.getLogger().addHandler(handler)
    record: dict[str, Any] = {
        "command": typed_command(
            os.environ.get("PRETRAINLAB_COMMAND") or shlex.join(["python", "-m", "pretrainlab.slot", *sys.argv[1:]])
        ),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(a.started_at)),
        "seeds": seeds,
        "installed": a.installed,
        "device": describe(),
        "code": code_version(),
    }
    study_dir = work / "slot"  # until the study's config names it
    archive = a.out / f"slot-{label}.tar.gz"
    stack = contextlib.ExitStack()  # the slot's time limit, once its length is known
    refused = True  # until the checks before any work have passed: a refusal writes no record and no archive
    earlier: list[dict] = []  # a slot continued: the records of its starts before this one
    try:
        timeline.mark("unpack")
        inputs, manifest = unpack(a.inputs, work)
        record["inputs"] = {"digest": digest(manifest), "archive": str(a.inputs), "corpus": manifest.get("corpus")}
        cfg = compose_study(inputs, seeds, work, a.overrides)
        study_dir, archive = work / cfg.study, a.out / f"{cfg.study}-{label}.tar.gz"
        check_work_seed(study_dir, seeds)
        if archive.exists():
            raise ConfigError(f"{archive} exists: give another --out (a slot's archive is never replaced).")
        planned_from = _budget_of(a.plan_from) if a.plan_from is not None else None
        if a.rates_from is not None and (a.plan_from is not None or a.budget_flops is not None):
            raise ConfigError("--rates-from plans a budget: give it without --budget-flops and --plan-from.")
        earlier_rates = rates_from(a.rates_from, cfg, seeds, record["device"]) if a.rates_from is not None else None
        if earlier_rates is not None and earlier_rates["slot"]["code"] != record["code"].get("digest"):
            log.warning(
                "--rates-from %s: its throughput was measured with other code (%s; this is %s): if the pretraining "
                "step has changed since, the runs may train faster or slower than planned",
                a.rates_from,
                earlier_rates["slot"]["code"],
                record["code"].get("digest"),
            )
        plan_file = study_dir / "plan.json"
        try:
            kept = json.loads(plan_file.read_text()) if plan_file.is_file() else None
            assert kept is None or isinstance(kept.get("budget_flops"), int | float)
        except (ValueError, AssertionError, AttributeError):
            raise ConfigError(
                f"{plan_file}: not the budget a slot planned (damaged or edited). Move it away to plan again, "
                f"or give the slot another --work."
            ) from None
        # the study's own checks before any work, at the budget it will have (calibration's is not known yet)
        checked = cfg.copy()
        checked.budget_flops = float(
            (kept or {}).get("budget_flops") or a.budget_flops or planned_from or math.inf  # to plan: any is larger
        )
        ablation.check_study(checked)
        runs = len(study_arms(cfg)) * len(seeds)
        if int(cfg.jobs) < runs:
            raise ConfigError(
                f"jobs={cfg.jobs}: the slot trains its {runs} pretraining runs all at once (its plan assumes it); give "
                f"jobs={runs} or more, or jobs=all (conf/ablate_slot.yaml)."
            )
        refused = False
        earlier = earlier_starts(study_dir / "report")
        minutes = float(a.minutes if a.minutes is not None else cfg.slot.minutes)
        deadline = a.started_at + 60 * minutes
        record.update(minutes=minutes, settings=settings(cfg), study=str(cfg.study))
        kept_s = float(cfg.slot.reserve_s.report)
        stack.enter_context(time_limit(deadline - kept_s, timeline, minutes, kept_s))
        # every process of the slot (calibration, pretraining, evaluation) a client of one MPS daemon
        first_run, _ = pretraining_config(checked, next(iter(study_arms(cfg))), seeds[0])
        daemon = stack.enter_context(
            mps.shared(cfg.get("mps", "auto"), int(cfg.get("jobs", 1)), uses_cuda(first_run), study_dir / "logs")
        )
        record["mps"] = {"running": daemon.running, "status": daemon.status}
        log.info("slot: %s", daemon.status)
        if kept is not None:
            plan = kept
            plan["source"] = f"{plan.get('source')}, kept from the slot's first start"
            log.info(
                "plan: %.2g FLOPs per objective, kept from this slot's first start (%s)",
                plan["budget_flops"],
                plan_file,
            )
        elif a.budget_flops is not None:
            plan = {"budget_flops": float(a.budget_flops), "source": "given (--budget-flops)"}
        elif a.plan_from is not None:
            plan = {"budget_flops": planned_from, "source": f"from {a.plan_from.name} (--plan-from)"}
        elif earlier_rates is not None:
            if earlier_rates["mps"] != daemon.running:
                raise ConfigError(
                    f"--rates-from {a.rates_from}: its runs were measured with MPS {'running' if earlier_rates['mps'] else 'not running'}, "
                    f"and here MPS is {daemon.status}: their throughput is not this slot's. Calibrate in this slot "
                    f"(leave out --rates-from)."
                )
            plan = plan_from_rates(cfg, earlier_rates, deadline, timeline)
        else:
            study_dir.mkdir(parents=True, exist_ok=True)
            plan = calibrate(cfg, study_dir, deadline, timeline)
        record["plan"] = plan
        study_dir.mkdir(parents=True, exist_ok=True)
        atomic.write_json(plan_file, plan)
        cfg.budget_flops = float(plan["budget_flops"])
        ablation.run_study(cfg, timeline=timeline.mark)
    except BaseException as e:
        record["error"] = f"{type(e).__name__}: {e}"
        log.error("slot failed: %s", record["error"])
        raise
    finally:
        stack.close()
        utilisation.stop()
        account(record, timeline, utilisation, study_dir, earlier)
        report = study_dir / "report"
        failed = f"-failed-{time.strftime('%H%M%S')}" if record.get("error") else ""
        # a failed record never replaces a finished one
        name = f"slot{failed}" if failed and finished(report / "slot.json") else "slot"
        if not refused:
            atomic.write_json(report / f"{name}.json", record)
            atomic.write_text(report / f"{name}.md", slot_markdown(record) + "\n")
            if not failed:  # the cost's durations: the slot's phases, over its starts
                starts = len(record.get("earlier") or []) + 1
                recost(report, [record], f"over its {starts} starts" if starts > 1 else "")
        archive = archive.with_name(archive.name.replace(".tar.gz", f"{failed}.tar.gz"))  # a failed slot's own name
        if not refused and not archive.exists():
            write_archive(study_dir, archive, {"slot.log": work / "slot.log"})
            log.info(
                "slot: results -> %s (%.1f MiB, %.0f s after the command started)",
                archive,
                archive.stat().st_size / 2**20,
                time.time() - a.started_at,
            )
        logging.getLogger().removeHandler(handler)
        handler.close()
    return archive


__all__ = [
    "SlotArgs",
    "Timeline",
    "TimeUp",
    "compose_study",
    "earlier_starts",
    "run_slot",
    "settings",
    "time_limit",
    "with_earlier",
]
