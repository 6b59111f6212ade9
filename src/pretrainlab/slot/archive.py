"""What a slot brings back, and several slots merged into one report.

A slot's results archive (``<study>-s<seed>.tar.gz``, one file) holds its study directory
without weights: every pretraining run's config, learning curve, held-out checks and export record
(``encoder.json``, the export's ``config.json``), every evaluation's results, the study's report
with the slot's own account (``report/slot.json``, ``slot.md``) and the logs. Checkpoints, encoder
weights and tokenizers stay on the machine that made them.

:func:`merge` puts the archives of several slots, one pretraining seed each, side by side in one
study directory and writes its report as the study would (intervals over pretraining seeds). Only
slots of one experiment are merged: the same study settings, the same inputs (by their digest), the
same code (by its digest) and the same FLOP budget; anything else is refused, naming what differs.
"""

from __future__ import annotations

import json
import logging
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from pretrainlab import atomic
from pretrainlab.slot.inputs import safe_extract
from pretrainlab.slot.report import recost, slot_markdown
from pretrainlab.studies.cost import EXPORT_RECORD
from pretrainlab.studies.intrinsic import learning_curves, learning_report
from pretrainlab.studies.report import report_study
from pretrainlab.studies.work import study_tasks

log = logging.getLogger("pretrainlab")

SKIP_SUFFIXES = (".ckpt", ".safetensors", ".bin", ".pt", ".lock")
SKIP_DIRS = ("checkpoints", "encoder", "wandb")
SCRATCH_DIRS = ("glue-scratch", "eval-scratch")


class MergeError(ValueError):
    """Archives that are not slots of one experiment."""


def _members(study: Path) -> list[tuple[Path, str]]:
    """(file, name in the archive) of what a slot brings back from its study directory."""
    out = []
    for f in sorted(study.rglob("*")):
        rel = f.relative_to(study)
        if not f.is_file() or f.suffix in SKIP_SUFFIXES or rel.parts[0] == "calibration":
            continue
        if rel.parts[0] == "pretrain" and len(rel.parts) > 2:
            inside = rel.parts[2:]
            if inside[0] in SKIP_DIRS or inside[0] == "snapshots":
                if inside[0] == "encoder" and inside[-1] == "config.json" and len(inside) == 2:
                    out.append((f, (Path(*rel.parts[:2]) / EXPORT_RECORD).as_posix()))
                continue
            if any(p in SKIP_DIRS for p in inside[:-1]):
                continue
        out.append((f, rel.as_posix()))
    return out


def write_archive(study: Path, out: Path, extra: dict[str, Path] | None = None) -> Path:
    """``out`` (``.tar.gz``): what a slot brings back of ``study`` (see the module docstring), and the
    files of ``extra`` (name in the archive -> file)."""
    members = _members(study) + [(f, name) for name, f in (extra or {}).items() if f.is_file()]

    def write(tmp: Path) -> None:
        with tarfile.open(tmp, "w:gz") as tar:
            for f, name in members:
                tar.add(f, arcname=f"{study.name}/{name}")

    atomic.write_named(out, write)
    return out


def _open(archive: Path, into: Path) -> tuple[Path, dict]:
    """Unpack ``archive`` into ``into``; its study directory and its ``slot.json``."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            if any(not m.isfile() and not m.isdir() for m in members) or any(
                ".." in Path(m.name).parts or Path(m.name).is_absolute() for m in members
            ):
                raise MergeError(f"{archive} holds links or paths outside its folder: it is not a slot's archive.")
            safe_extract(tar, into, members)
    except (tarfile.TarError, EOFError, OSError) as e:
        raise MergeError(f"{archive} cannot be read as a .tar.gz ({e}).") from None
    studies = [d for d in into.iterdir() if d.is_dir()]
    record = studies[0] / "report" / "slot.json" if len(studies) == 1 else None
    if record is None or not record.is_file():
        raise MergeError(f"{archive} is not a slot's results archive (no <study>/report/slot.json in it).")
    try:
        loaded = json.loads(record.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise MergeError(
            f"{archive}: its {record.relative_to(into)} is not JSON ({e}): the archive is damaged."
        ) from None
    if isinstance(loaded, dict) and loaded.get("error"):  # stopped before it planned, or after: either way failed
        raise MergeError(f"{archive} is the archive of a slot that failed ({loaded['error']}): merge finished slots.")
    missing = [k for k in ("settings", "seeds", "plan") if not isinstance(loaded, dict) or k not in loaded]
    if missing:
        raise MergeError(
            f"{archive}: its {record.relative_to(into)} records no {', '.join(missing)}: it is not a slot's record "
            f"(or it was edited)."
        )
    return studies[0], loaded


# what must be equal for slots to be merged, and what it is called in the refusal
SAME = {
    "settings": "the study's settings differ",
    "inputs": "the inputs (corpus, tokenizer, evaluation files) differ",
    "code": "the code differs",
    "budget_flops": "the FLOP budget differs",
}


def _identity(record: dict) -> dict[str, Any]:
    return {
        "settings": record.get("settings"),
        "inputs": (record.get("inputs") or {}).get("digest"),
        "code": (record.get("code") or {}).get("digest"),
        "budget_flops": (record.get("plan") or {}).get("budget_flops"),
    }


def differences(a: Any, b: Any, key: str = "") -> list[str]:
    """Where two records differ, key by key (`lr: 0.002 against 0.0005`)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{key}.{k}" if key else k)]
    return [] if a == b else [f"{key or 'value'}: {a!r} against {b!r}"]


def merge(archives: list[str | Path], out: str | Path) -> dict:
    """Merge the results archives of several slots into the study directory ``out`` (new or empty)
    and write its report; returns the comparison table. Every refusal comes before anything is written,
    and a merge that fails on the way leaves ``out`` as it found it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise MergeError(f"--out {out} is a file: merge into a new directory (nothing is replaced).")
    if out.exists() and any(out.iterdir()):
        raise MergeError(f"{out} is not empty: merge into a new directory (nothing is replaced).")
    if not archives:
        raise MergeError("name the slots' results archives to merge.")
    paths = [Path(a) for a in archives]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise MergeError(f"no such archive: {', '.join(missing)}")
    twice = [str(q) for k, q in enumerate(paths) if any(q.samefile(r) for r in paths[:k])]
    if twice:
        raise MergeError(f"{twice[0]} is given twice: name each slot's archive once.")
    with tempfile.TemporaryDirectory(prefix="pretrainlab-merge-") as tmp:
        opened = [_open(p, Path(tmp) / f"{i}") for i, p in enumerate(paths)]
        for path, (_, record) in zip(paths, opened):
            if record.get("error"):
                raise MergeError(
                    f"{path} is the archive of a slot that failed ({record['error']}): merge finished slots."
                )
        first = _identity(opened[0][1])
        for path, (_, record) in zip(paths[1:], opened[1:]):
            mine = _identity(record)
            for key, what in SAME.items():
                if mine[key] != first[key]:
                    detail = "; ".join(differences(first[key], mine[key])[:4])
                    raise MergeError(
                        f"{path} is a slot of another experiment than {paths[0]}: {what} ({detail}). Slots merge "
                        f"only when they ran the same study, on the same inputs, with the same code and budget; "
                        f"run the missing seeds again with those (--plan-from {paths[0]})."
                    )
        seen: dict[str, Path] = {}
        for path, (study, _) in zip(paths, opened):  # every refusal before anything is written
            for run in sorted((study / "pretrain").iterdir()):
                if run.name in seen:
                    raise MergeError(
                        f"{run.name} is in both {seen[run.name]} and {path}: each slot must pretrain another seed."
                    )
                seen[run.name] = path
        existed = out.is_dir()
        try:
            return _merge(paths, opened, out)
        except BaseException:  # no half-written folder left to refuse the next try as "not empty"
            if out.is_dir():
                for child in out.iterdir():
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
                if not existed:
                    out.rmdir()
            raise


def _merge(paths: list[Path], opened: list[tuple[Path, dict]], out: Path) -> dict:
    """The merge's writing, once every archive is accepted (``merge``)."""

    scratch: Path | None = None  # the slot whose scratch baseline is kept
    out.mkdir(parents=True, exist_ok=True)
    for path, (study, _) in zip(paths, opened):
        for run in sorted((study / "pretrain").iterdir()):
            # the scratch baseline (random weights of one architecture and tokenizer, seeded by the
            # fine-tuning seed) is the same encoder in every slot: it is reported once, from the first
            has_scratch = any((run / d).is_dir() for d in SCRATCH_DIRS)
            keep_scratch = has_scratch and scratch in (None, path)
            scratch = path if keep_scratch else scratch
            skip = () if keep_scratch else SCRATCH_DIRS
            shutil.copytree(
                run, out / "pretrain" / run.name, ignore=lambda d, names, skip=skip: [n for n in names if n in skip]
            )
        slot_dir = out / "slots" / _stem(path)
        shutil.copytree(study / "report", slot_dir / "report")
        if (study / "logs").is_dir():
            shutil.copytree(study / "logs", slot_dir / "logs")
    records = [record for _, record in opened]
    cfg = OmegaConf.create(records[0]["settings"])
    seeds = sorted({int(s) for r in records for s in r["seeds"]})
    cfg.seeds = seeds
    runs = sorted((out / "pretrain").iterdir())
    report = out / "report"
    learned = learning_report(runs, report, recorded=True)
    learning_curves(runs, report)
    tasks = study_tasks(cfg)
    table = report_study(cfg, runs, report, tasks, [int(s) for s in cfg.suite.seeds], [], learned, recorded=True)
    recost(report, records, "in its slot" if len(records) == 1 else f"over the {len(records)} slots")
    measured_on(report / "provenance.json", [out / "slots" / _stem(p) for p in paths])
    for path, record in zip(paths, records):  # each slot's own record, as its slot.md says it
        stem = f"slot-{_stem(path)}"
        atomic.write_json(report / f"{stem}.json", record)
        atomic.write_text(report / f"{stem}.md", slot_markdown(record) + "\n")
    atomic.write_json(report / "slots.json", {"archives": [str(p) for p in paths], "slots": records})
    atomic.write_text(report / "slots.md", slots_markdown(paths, records) + "\n")
    log.info("merged %d slots (pretraining seeds %s) -> %s", len(paths), seeds, report)
    return table


def _stem(archive: Path) -> str:
    """A slot's archive's name without ``.tar.gz``: its folder under ``slots/`` and its record's name."""
    return archive.name.removesuffix(".tar.gz")


def measured_on(provenance: Path, slots: list[Path]) -> None:
    """The merged report's provenance says where its numbers were measured: each slot's command, commit,
    date and device (``slots``), and as its ``device`` the slots' devices, merged on this machine."""
    record = json.loads(provenance.read_text())
    made = []
    for slot in slots:
        try:
            own = json.loads((slot / "report" / "provenance.json").read_text())
        except (OSError, ValueError):
            continue
        made.append({k: own.get(k) for k in ("command", "commit", "dirty", "date", "device")})
    devices = list(dict.fromkeys(str(m["device"]) for m in made if m.get("device")))
    if devices:
        record["device"] = (
            f"{'; '.join(devices)} (the {'slot' if len(slots) == 1 else 'slots'}; merged on {record['device']})"
        )
    record["slots"] = made
    atomic.write_json(provenance, record)


def slots_markdown(paths: list[Path], records: list[dict]) -> str:
    """One line per slot: its seed, device, length, budget and phases (its own record: ``slot-<archive>.md``)."""
    lines = [
        "# The slots of this report",
        "",
        "| slot | pretraining seed | device | wall-clock | budget per objective | calibration | pretraining | evaluation |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path, r in zip(paths, records):
        phases = r.get("phases") or {}

        def length(name: str, phases: dict = phases) -> str:
            p = phases.get(name)
            return f"{p['seconds']:.0f} s" if p else "–"

        lines.append(
            f"| [{path.name}](slot-{_stem(path)}.md) | {', '.join(map(str, r.get('seeds', [])))} | {(r.get('device') or {}).get('device', '?')} | "
            f"{r.get('wall_s', 0):.0f} s | {(r.get('plan') or {}).get('budget_flops', 0):.2g} FLOPs | "
            f"{length('calibration')} | {length('pretraining')} | {length('evaluation')} |"
        )
    first = records[0]
    code = first.get("code") or {}
    lines += [
        "",
        f"Code {code.get('digest')} (commit {str(code.get('commit'))[:10]}), inputs {first.get('inputs', {}).get('digest')}, "
        f"the same in every slot.",
    ]
    return "\n".join(lines)


__all__ = ["MergeError", "differences", "merge", "write_archive"]
