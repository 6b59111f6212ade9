"""Every evaluation task an encoder can be given, by name (``task=<name>``, ``tasks=[...]``).

    kind    glue     fine-tuning a sequence classifier (``finetuning/``); GLUE's nine tasks
            ner      fine-tuning a token classifier: named entities (``tagging.py``)
            blimp    zero-shot minimal pairs, scored by the pretraining objective (``blimp.py``)
            probe    frozen features, linear probes per layer (``probes.py``)

A task's results record ``metrics``; its score is their mean x 100. ``data`` names the config block
that holds its data settings (``glue:``, ``ner:``, ``blimp:``), which a finished result must match.
A task that is not ``seeded`` is deterministic (zero-shot): it runs once, as seed 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from pretrainlab.config import plain_or_none
from pretrainlab.glue.tasks import TASKS as GLUE_TASKS


@dataclass(frozen=True)
class Evaluation:
    name: str
    display: str
    kind: str  # glue | ner | blimp | probe
    metrics: tuple[str, ...]  # the keys of its results' metrics, in order
    data: str  # the config block of its data settings
    seeded: bool = True

    @property
    def fine_tuned(self) -> bool:
        """Whether the encoder's weights are trained for it (the suite's task_overrides apply)."""
        return self.kind in ("glue", "ner")


EVALUATIONS: dict[str, Evaluation] = {
    **{t.name: Evaluation(t.name, t.directory, "glue", tuple(t.metric_names()), "glue") for t in GLUE_TASKS.values()},
    "ner": Evaluation("ner", "NER", "ner", ("f1",), "ner"),
    "blimp": Evaluation("blimp", "BLiMP", "blimp", ("accuracy",), "blimp", seeded=False),
    "probe_ner": Evaluation("probe_ner", "NER probe", "probe", ("f1",), "ner"),
    "probe_sst2": Evaluation("probe_sst2", "SST-2 probe", "probe", ("accuracy",), "glue"),
}
ORDER = list(EVALUATIONS)


def get(name: str) -> Evaluation:
    key = name.lower().replace("-", "")
    if key not in EVALUATIONS:
        raise KeyError(f"unknown evaluation task {name!r}; the tasks are: {', '.join(EVALUATIONS)}.")
    return EVALUATIONS[key]


def display_name(name: str) -> str:
    """CoLA, SST-2, NER, BLiMP, ...: how a task is written in tables."""
    return EVALUATIONS[name].display if name in EVALUATIONS else name


def is_glue(name: str) -> bool:
    return name in EVALUATIONS and EVALUATIONS[name].kind == "glue"


def data_digests(name: str, cfg) -> dict[str, str] | None:
    """The sha256 of the local files task ``name`` reads under the fine-tuning config ``cfg`` (the
    synthetic ones generated into the cache first), without parsing them; None from the hub. A
    finished result records them, so that data edited since is noticed."""

    from pretrainlab.data.hashing import file_digest

    task = get(name)
    block = cfg[task.data]
    synthetic = plain_or_none(block.get("synthetic"))
    if task.data == "glue":
        from pretrainlab.glue.data import data_digests as glue_digests
        from pretrainlab.glue.tasks import get_task

        return glue_digests(
            get_task(name.removeprefix("probe_")), block.source, block.data_dir, cfg.cache_dir, synthetic
        )
    if task.data == "ner":
        from pretrainlab.evaluation.ner import data_root, split_files

        root = data_root(block.source, block.data_dir, cfg.cache_dir, synthetic)
        return None if root is None else {p.name: file_digest(p) for p in split_files(root).values()}
    from pretrainlab.evaluation.blimp import data_root

    root = data_root(block.source, block.data_dir, cfg.cache_dir, synthetic)
    return None if root is None else {f.name: file_digest(f) for f in sorted(root.glob("*.jsonl"))}


__all__ = ["EVALUATIONS", "Evaluation", "ORDER", "data_digests", "display_name", "get", "is_glue"]
