"""The evaluation plugin contract: what an encoder is scored on, and how.

An evaluation is a class (a subclass of :class:`Evaluation`) named by its config's ``_target_``
(``conf/task/<name>.yaml``): the YAML is the registry, as ``conf/objective/`` is the objectives'.
The runner (``evaluation.run``), the suite, the study and the comparison call the contract and nothing
else; no code outside an evaluation's own module names it or asks what kind it is.

An evaluation owns

- what it is: ``name`` and ``display`` (CoLA, NER, BLiMP, SQuAD), its ``metrics`` (the keys of its
  results' metrics, in order; the task's score is their mean x 100) and the ``headline`` one, whether
  it trains the encoder (``fine_tuned``: the suite's recipe overrides apply) and whether it is seeded
  (``seeded``: a zero-shot evaluation is deterministic and runs once), the config block of its data
  settings (``data``), the study entry that asks for it (``group``), where a suite writes its results
  (``family``), and whether it counts in the GLUE score;
- its data: the local files it reads (``data_files``, the synthetic ones generated first; none from
  the hub) and their digests, which every result records and every finished result is checked against;
- the work: ``evaluate(cfg, model, fitting)`` fine-tunes the encoder (through ``fitting``, the loop every
  fine-tuned head shares: ``evaluation.finetuning``), scores it zero-shot, or probes its frozen features, and
  returns the fields of its results: its metrics, and its trivial baseline's (``no_skill``);
- its place in a comparison beyond the main table: :meth:`Evaluation.sections` (BLiMP by paradigm,
  the probes layer by layer).

``get(name)`` is how everything else finds one: ``conf/task/<name>.yaml``, instantiated; a name or a
``_target_`` that is not an evaluation is refused with the list of those there are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from omegaconf import DictConfig, OmegaConf

from pretrainlab.config import ConfigError
from pretrainlab.runtime.hydra import CONF

TASKS = CONF / "task"


class UnknownEvaluation(ConfigError, KeyError):
    """A task name, or a task config's ``_target_``, that is not an evaluation."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass
class Section:
    """What an evaluation adds to a comparison beyond its column of the main table: ``table`` (kept in
    ``comparison.json`` under ``key``), ``markdown`` (``<key>.md``), ``summary`` (what ``comparison.md``
    says of it) and, optionally, ``plot`` (writes ``<key>.png``)."""

    key: str
    table: dict
    markdown: str
    summary: str
    plot: Callable[[Path], object] | None = None


class Evaluation:
    """One evaluation task (see the module docstring). ``name`` and the recipe (learning rate, epochs,
    sequence length, ...) come from its config; subclasses set the rest."""

    fine_tuned: ClassVar[bool] = True
    seeded: ClassVar[bool] = True
    family: ClassVar[str] = "eval"  # results go to <run>/<family>/ (<family>-scratch for init=scratch)
    in_glue_score: ClassVar[bool] = False
    rank: ClassVar[int] = 50  # where its column stands in tables (GLUE's tasks first)

    def __init__(self, name: str, **recipe: Any):
        self.name = name
        self.recipe = recipe

    # --- what it is ---------------------------------------------------------------------------------------
    @property
    def display(self) -> str:
        raise NotImplementedError

    @property
    def metrics(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def headline(self) -> str:
        return self.metrics[0]

    @property
    def data(self) -> str:
        """The config block (of ``conf/finetune.yaml``) that holds its data settings."""
        raise NotImplementedError

    @property
    def group(self) -> str:
        """The entry of a study's ``evals`` that asks for it."""
        return self.name

    def metric_label(self, metric: str) -> str:
        """How a table's header writes one of its metrics (acc, MCC, F1, P, S; acc-m for MNLI's matched set)."""
        short = {"accuracy": "acc", "mcc": "MCC", "f1": "F1", "pearson": "P", "spearman": "S"}
        name, _, suffix = metric.partition("_")
        return short.get(name, name) + (f"-{suffix}" if suffix else "")

    def order(self) -> tuple:
        """Its place among the columns of a table."""
        return (self.rank, self.name)

    @property
    def score_range(self) -> tuple[float, float]:
        """Where its score can lie: 0 to 100, or -100 to 100 when a metric is a correlation (MCC, Pearson,
        Spearman). Intervals are cut to it."""
        signed = any(m.partition("_")[0] in ("mcc", "pearson", "spearman") for m in self.metrics)
        return (-100.0 if signed else 0.0, 100.0)

    def score(self, metrics: dict[str, float]) -> float:
        """The task's score: the mean of its metrics, x 100."""
        return 100.0 * sum(float(v) for v in metrics.values()) / len(metrics)

    # --- its data -----------------------------------------------------------------------------------------
    def data_files(self, cfg: DictConfig) -> list[Path] | None:
        """The local files it reads under ``cfg`` (synthetic ones generated into the cache first); None
        when it reads the Hugging Face hub."""
        raise NotImplementedError

    def digests(self, cfg: DictConfig) -> dict[str, str] | None:
        """The sha256 of every file it reads (by a name that says which file), without parsing them; None
        from the hub, whose datasets are versioned. A finished result records them."""
        from pretrainlab.data.hashing import file_digest

        files = self.data_files(cfg)
        return None if files is None else {self.file_key(f): file_digest(f) for f in files}

    def file_key(self, path: Path) -> str:
        """How its results name one of its files (``RTE/dev.tsv``, ``dev.txt``)."""
        return path.name

    # --- the work -----------------------------------------------------------------------------------------
    def check(self, cfg: DictConfig) -> None:
        """Refuse settings it cannot work with, before anything is loaded (ConfigError)."""

    def evaluate(self, cfg: DictConfig, model: Any, fitting: Any) -> dict:
        """Evaluate ``model`` (``export.pretrained.Pretrained``) as ``cfg`` says; the fields of its
        results, ``metrics`` first. A fine-tuned evaluation trains through ``fitting``
        (``evaluation.finetuning.Fitting``)."""
        raise NotImplementedError

    def contradictions(self, result: dict) -> list[str]:
        """Where a result contradicts its own record (a file edited after it was written): a fine-tuned
        result's metrics are its last epoch's (``history``). Each contradiction in a few words."""
        history = result.get("history") or []
        if not self.fine_tuned or not history:
            return []
        last = history[-1].get("metrics") or {}
        return [
            f"{k} {v!r} where its last epoch's history says {last.get(k)!r}"
            for k, v in result["metrics"].items()
            if not _same(v, last.get(k))
        ]

    # --- its place in a comparison ------------------------------------------------------------------------
    @classmethod
    def sections(
        cls, results: list[dict], rows: dict[str, str], encoder_id: Callable[[dict], str], level: float
    ) -> list[Section]:
        """What this class of evaluation adds to a comparison of ``results`` (its own among them):
        ``rows`` maps an encoder id to its row, ``encoder_id(result)`` gives a result's."""
        return []


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(float(a) - float(b)) <= 1e-9


# --- finding them -----------------------------------------------------------------------------------------
def names() -> list[str]:
    """Every evaluation there is: the files of ``conf/task/``."""
    return sorted(p.stem for p in TASKS.glob("*.yaml"))


def _key(name: str) -> str:
    return str(name).lower().replace("-", "")


def instantiate(node: DictConfig | dict, where: str) -> Evaluation:
    """The evaluation a task config ``node`` names (its ``_target_``), refusing what is not one."""
    from hydra.utils import instantiate as hydra_instantiate

    target = dict(node or {}).get("_target_")
    if not target:
        raise UnknownEvaluation(
            f"{where} names no evaluation class (_target_); an evaluation's config names its class, e.g. "
            f"_target_: pretrainlab.evaluation.<module>.<Class> (conf/task/*.yaml)."
        )
    try:
        evaluation = hydra_instantiate(node, _convert_="all")
    except Exception as e:  # noqa: BLE001 - Hydra wraps import and constructor errors alike
        classes = sorted({str(cast(DictConfig, OmegaConf.load(p)).get("_target_")) for p in TASKS.glob("*.yaml")})
        raise UnknownEvaluation(
            f"{where}: _target_ {target!r} cannot be made into an evaluation ({str(e).splitlines()[0][:200]}); the "
            f"evaluation classes are: {', '.join(classes)}."
        ) from None
    if not isinstance(evaluation, Evaluation):
        raise UnknownEvaluation(
            f"{where}: {target} is not an evaluation (a subclass of pretrainlab.evaluation.base.Evaluation)."
        )
    return evaluation


@functools.cache
def get(name: str) -> Evaluation:
    """The evaluation called ``name`` (case and dashes aside: ``SST-2`` is ``sst2``): ``conf/task/<name>.yaml``."""
    key = _key(name)
    path = TASKS / f"{key}.yaml"
    if not path.is_file():
        raise UnknownEvaluation(f"unknown evaluation task {name!r}; the tasks are: {', '.join(names())}.")
    return instantiate(cast(DictConfig, OmegaConf.load(path)), str(path.relative_to(CONF.parent)))


def of(cfg: DictConfig) -> Evaluation:
    """The evaluation of a fine-tuning config (``cfg.task``, as composed or as a suite set it)."""
    task = cfg.get("task")
    if not task or "name" not in task:
        raise ConfigError("task=<name> is required (conf/task/: " + ", ".join(names()) + ").")
    return instantiate(task, f"task={task.name}")


def known(name: str) -> bool:
    return (TASKS / f"{_key(name)}.yaml").is_file()


def display_name(name: str) -> str:
    """CoLA, SST-2, NER, BLiMP, ...: how a task is written in tables (the name itself if unknown)."""
    return get(name).display if known(name) else name


def groups() -> dict[str, list[str]]:
    """Every entry a study's ``evals`` may hold, and the tasks it stands for (GLUE's: all nine; a study
    runs those of its ``glue.tasks``)."""
    out: dict[str, list[str]] = {}
    for name in names():
        out.setdefault(get(name).group, []).append(name)
    return out


def resolve(entries: list[str], glue_tasks: list[str]) -> list[str]:
    """The tasks a study's ``evals`` asks for: a group (``glue``: the tasks of ``glue_tasks``; ``probes``:
    every probe) or a task's own name; each once, in order. Anything else is refused with the list."""
    found = groups()
    out: list[str] = []
    for entry in entries:
        if entry in found:
            members = [get(t).name for t in glue_tasks] if entry == "glue" else found[entry]
            out += members
        elif known(entry):
            out.append(get(entry).name)
        else:
            raise UnknownEvaluation(
                f"evals: {entry!r} is not an evaluation; choose among {', '.join(sorted(found))} (groups) or a task "
                f"of conf/task/ ({', '.join(names())})."
            )
    return list(dict.fromkeys(out))


__all__ = [
    "Evaluation",
    "Section",
    "UnknownEvaluation",
    "display_name",
    "get",
    "groups",
    "instantiate",
    "known",
    "names",
    "of",
    "resolve",
]
