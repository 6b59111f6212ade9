"""Reading results to compare: results files under directories (and the fine-tuning runs of a W&B
project), each checked before it is put beside another.

A result must be whole and finite, of the encoder still at its recorded path, fine-tuned with the
same settings on the same data as the other results of its task, and counted once; an encoder is
one row of the table (:func:`row_labels`), whose results a snapshot's never join (:func:`is_final`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from pretrainlab.evaluation.base import FAMILIES
from pretrainlab.evaluation.results import (
    LEGACY,
    ResultError,
    changed_files,
    check_encoder,
    is_result,
    is_results_file,
    read_result,
    settings_of,
)
from pretrainlab.export.native import resolve_export_dir
from pretrainlab.export.pretrained import encoder_identity
from pretrainlab.runtime.provenance import describe, differences
from pretrainlab.runtime.wandb_runs import finetune_results


class CompareError(ValueError):
    """Results that cannot be put side by side without misreporting one of them."""


def encoder_of(r: dict) -> dict:
    """Who produced a result: ``id`` (the encoder's weights hash; for init=scratch, its architecture
    and tokenizer), ``label`` (objective, ``scratch``, ``hf:<name>``), ``model`` (the model preset or
    the encoder's shape), ``pretrain_seed`` and where it came from. Results written before the
    hash was recorded are identified by their encoder's path."""
    p = r.get("pretrained") or {}
    label = r.get("label_override") or r["label"]
    return {
        "id": p.get("encoder_id") or p.get("path") or label,
        "label": label,
        "model": p.get("model"),
        "pretrain_seed": p.get("pretrain_seed"),
        "source": p.get("run_dir") or p.get("path") or "?",
    }


def collect(
    sources: list[str], labels: dict[str, str] | None = None, keep: Callable[[dict], bool] | None = None
) -> list[dict]:
    """Results from directories (searched recursively for results JSON files) and W&B projects.
    ``labels`` (source -> name) relabels the pretrained encoders' results found under a source (not
    the scratch baseline's); ``keep`` chooses the results to compare (a study's tasks and seeds),
    before they are checked against each other.

    Every results file is read whole and must hold finite metrics; a result whose encoder is still
    where it was recorded must be of that encoder (not of one pretrained there before); results of
    one task must have been fine-tuned with the same settings, on the same data files
    (``pretrainlab.evaluation.results``). The same result reached twice (a run directory and its
    ``glue/``) counts once; two different fine-tuning runs of one encoder, task and seed are
    refused, since one would hide the other."""
    results: list[dict] = []
    identities: dict = {}
    labels = {
        str(Path(k).expanduser().resolve()) if not k.startswith("wandb:") else k: v for k, v in (labels or {}).items()
    }
    for src in sources:
        found: list[dict] = []
        if str(src).startswith("wandb:"):
            found = finetune_results(str(src)[len("wandb:") :])
            key = str(src)
        else:
            p = Path(src).expanduser()
            if not p.exists():
                raise FileNotFoundError(f"{src}: no such results directory or file.")
            key = str(p.resolve())
            for f in [p] if p.is_file() else sorted(p.rglob("*.json")):
                d = _read(f, strict=p.is_file() or is_results_file(f))
                if d is not None and (keep is None or keep(d)):
                    d.setdefault("run_dir", str(f.parent))
                    check_current_encoder(d, f, identities)
                    found.append(d)
        for d in found:
            if key in labels and d.get("label") != "scratch":  # the scratch baseline keeps its own row
                d["label_override"] = labels[key]
        results += [d for d in found if keep is None or keep(d)]  # (W&B results are chosen here)
    unique: dict[tuple, dict] = {}
    for r in results:
        k = (encoder_of(r)["id"], encoder_of(r)["label"], r["task"], r["seed"])
        if k in unique and unique[k].get("run_dir") != r.get("run_dir"):
            raise CompareError(
                f"{r['task']} seed {r['seed']} of encoder {encoder_of(r)['source']} was fine-tuned twice: "
                f"{unique[k].get('run_dir')} and {r.get('run_dir')}. Compare one of them (move the other away)."
            )
        unique[k] = r
    if not unique:
        raise FileNotFoundError(f"no GLUE results found in {', '.join(map(str, sources))}.")
    _check_same_settings(list(unique.values()))
    return list(unique.values())


def _read(f: Path, strict: bool) -> dict | None:
    """The result in ``f``; a results file (``seed<k>.json``, ``results.json``, or a file named on
    the command line) that cannot be read whole, or holds non-finite metrics, is refused; any other
    JSON file that is not a result is passed over."""
    if strict:
        try:
            return read_result(f)
        except ResultError as e:
            raise CompareError(str(e)) from None
    try:
        d = json.loads(f.read_text())
    except (ValueError, UnicodeDecodeError, OSError):
        return None
    if not is_result(d):
        return None
    try:
        return read_result(f)
    except ResultError as e:
        raise CompareError(str(e)) from None


def check_current_encoder(result: dict, path: Path, identities: dict) -> None:
    """Refuse ``result`` (read from ``path``) when the directory of the encoder it records now holds
    another encoder (pretrained again); bring its record of the encoder's place in its run's budget
    (``fraction``, ``pretrain_flops``) up to date. A result whose encoder is gone is kept as recorded.
    ``identities`` caches the encoders' identities during one collection."""
    recorded = result.get("pretrained") or {}
    if "encoder_id" not in recorded or str(recorded.get("objective") or "").startswith("hf:"):
        return
    encoder = _encoder_dir(recorded.get("path"), path)
    if encoder is None:
        return
    init = recorded.get("init") or "pretrained"
    key = (str(encoder), init)
    if key not in identities:
        identities[key] = encoder_identity(str(encoder), init)
    identity = identities[key]
    try:
        check_encoder(result, identity, init, path)
    except ResultError as e:
        raise CompareError(
            f"{e} (A result is compared only while its encoder is the one there: these scores are not "
            f"those of {encoder}.)"
        ) from None
    if recorded.get("fraction") is not None:
        result["pretrained"] = {
            **recorded,
            "fraction": identity["fraction"],
            "pretrain_flops": identity["pretrain_flops"],
        }


def _encoder_dir(recorded: str | None, results_file: Path) -> Path | None:
    """The export directory of a result's encoder: for a suite's results
    (``<run or export>/{glue,eval}*/<task>/seed<k>.json``) the encoder beside them (a copied run directory
    still records the original's path), else where it was recorded."""
    candidates = []
    if len(results_file.parents) > 2 and results_file.parents[1].name.startswith(FAMILIES):
        candidates.append(results_file.parents[2])
    if recorded:
        candidates.append(Path(recorded))
    for c in candidates:
        try:
            return resolve_export_dir(c).resolve()
        except FileNotFoundError:
            continue
    return None


def _check_same_settings(results: list[dict]) -> None:
    """Results of one task must have been fine-tuned with the same settings and on the same data
    files, or their scores measure two experiments."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        by_task[r["task"]].append(r)
    for task, rs in by_task.items():
        recorded = [r for r in rs if r.get("config")]
        for r in recorded[1:]:
            a, b = settings_of(recorded[0]), settings_of(r)
            changed = differences(a, b, legacy=LEGACY) or [(k, y, x) for k, x, y in differences(b, a, legacy=LEGACY)]
            if changed:
                raise CompareError(
                    f"{task} results were fine-tuned with different settings: {describe(changed)} "
                    f"('then' in {recorded[0].get('run_dir')}, 'now' in {r.get('run_dir')}). Side by side they would "
                    f"compare two experiments; compare results made with the same settings (one report each)."
                )
        with_files = [r for r in rs if (r.get("data") or {}).get("files")]
        for r in with_files[1:]:
            a, b = with_files[0]["data"]["files"], r["data"]["files"]
            differing = changed_files(a, b)
            if differing:
                raise CompareError(
                    f"{task} results were computed on different data: {', '.join(differing)} differ between "
                    f"{with_files[0].get('run_dir')} and {r.get('run_dir')} (sha256 {str(a.get(differing[0]))[:12]} and "
                    f"{str(b.get(differing[0]))[:12]}). Scores on different data are not comparable: re-run them on the "
                    f"same files."
                )


def is_final(r: dict) -> bool:
    """A result of a run's final encoder (or of an encoder outside a run), not of a snapshot."""
    fraction = (r.get("pretrained") or {}).get("fraction")
    return fraction is None or float(fraction) >= 1.0


def as_final(r: dict) -> dict:
    """``r`` presented as the result of a final encoder (a snapshot's suite summarised on its own)."""
    return {**r, "pretrained": {**(r.get("pretrained") or {}), "fraction": None}}


def row_labels(results: list[dict]) -> dict[str, str]:
    """Encoder id -> its row: the label, with the model when the results span several models.
    Pretraining seeds of one (label, model) share a row; two encoders claiming the same label,
    model and pretraining seed are refused."""
    encoders: dict = {}
    for r in results:
        e = encoder_of(r)
        encoders.setdefault(e["id"], e)
    models = {e["model"] for e in encoders.values()}
    several = len(models) > 1
    rows: dict = {}
    claimed: dict = {}
    for eid, e in encoders.items():
        row = f"{e['label']} ({e['model'] or '?'})" if several else e["label"]
        rows[eid] = row
        key = (row, e["pretrain_seed"])
        if key in claimed and claimed[key]["id"] != eid:
            other = claimed[key]
            seed = "" if e["pretrain_seed"] is None else f", pretraining seed {e['pretrain_seed']}"
            raise CompareError(
                f"two different encoders are both '{row}'{seed}: {other['source']} and {e['source']}. Their results "
                f"would be mixed in one row. Compare them in separate reports, or name them apart with "
                f"--label <results dir>=<name>."
            )
        claimed[key] = e
    return rows


__all__ = ["CompareError", "as_final", "check_current_encoder", "collect", "encoder_of", "is_final", "row_labels"]
