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
  settings (``data_block``), the study entry that asks for it (``group``), where a suite writes its
  results (``family``, one of :data:`FAMILIES`), and whether it counts in the GLUE score;
- its recipe, as typed constructor arguments (the keys of ``conf/task/<name>.yaml``: learning rate,
  epochs, sequence length, ...), and its data settings (``data``: a :class:`~pretrainlab.evaluation.data.DataBlock`
  read from the config when it is made by :func:`of`); it reads no config afterwards;
- its data: the local files it reads (``data_files``, the synthetic ones generated first; none from
  the hub) and their digests, which every result records and every finished result is checked against;
- the work: ``evaluate(run, model, fitting)`` fine-tunes the encoder (through ``fitting``, the loop every
  fine-tuned head shares: ``evaluation.finetuning``), scores it zero-shot, or probes its frozen features,
  and returns the fields of its results: its metrics, and its trivial baseline's (``no_skill``);
  ``run`` (:class:`RunContext`) is what the run gives it beside its recipe: the seed, the encoder's
  origin, the workers and the device. A fine-tuned evaluation whose runs can train several at once as
  one model (``fusable``: GLUE's tasks) also gives its fine-tuning ready to train, ``job(run, model,
  fitting)`` (a ``finetuning.Job`` whose module names its encoder call, its head and how it keeps a dev
  batch's predictions), which ``evaluation.fused`` trains with the others;
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

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from pretrainlab.config import ConfigError, plain
from pretrainlab.data.hashing import file_digest
from pretrainlab.evaluation.data import DataBlock
from pretrainlab.runtime.hydra import CONF

TASKS = CONF / "task"

# where a suite writes an evaluation's results, beside the encoder: <run>/<family>/ (<family>-scratch for
# init=scratch). GLUE's tasks are ``glue``, every other evaluation ``eval``; the run directory's overwrite
# (runtime.rundir.RUN_OUTPUTS), a study's cost and the comparison's collector read these folders.
FAMILIES = ("glue", "eval")


def result_dirs() -> tuple[str, ...]:
    """The folders of a run (or an export) that its evaluation suites write: every family, from the
    pretrained encoder and from scratch."""
    return tuple(f"{family}{suffix}" for family in FAMILIES for suffix in ("", "-scratch"))


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


@dataclass(frozen=True)
class RunContext:
    """What one run gives an evaluation beside its recipe and its data: the seed, the encoder it
    evaluates (``pretrained``, ``init``), data-loader workers, and where and how a task that trains
    nothing runs (``accelerator``, ``precision``, ``progress``)."""

    seed: int = 0
    pretrained: str = ""
    init: str = "pretrained"
    num_workers: int = 0
    accelerator: str = "auto"
    precision: str = "32"
    progress: bool = True

    @classmethod
    def of(cls, cfg: DictConfig) -> RunContext:
        """The context of a composed fine-tuning config."""
        trainer = cfg.get("trainer") or {}
        return cls(
            seed=int(cfg.get("seed", 0)),
            pretrained=str(cfg.get("pretrained", "")),
            init=str(cfg.get("init", "pretrained")),
            num_workers=int(cfg.get("num_workers", 0)),
            accelerator=str(trainer.get("accelerator", "auto")),
            precision=str(trainer.get("precision", "32")),
            progress=bool(trainer.get("enable_progress_bar", True)),
        )

    def inference_device(self) -> torch.device:
        """Where a task that trains nothing (zero-shot scoring, feature extraction) runs: the GPU when
        there is one and the trainer's accelerator allows it, else the CPU."""
        if torch.cuda.is_available() and self.accelerator in ("auto", "gpu", "cuda"):
            return torch.device("cuda")
        return torch.device("cpu")

    def inference_autocast(self, device: torch.device):
        """bf16 autocast on a GPU when the trainer's precision is bf16, else nothing."""
        return torch.autocast(
            device.type, dtype=torch.bfloat16, enabled=device.type == "cuda" and "bf16" in self.precision
        )


class Evaluation:
    """One evaluation task (see the module docstring). ``name`` and the recipe (learning rate, epochs,
    sequence length, ...) are its config's keys, given to the constructor; ``data`` is its data block.
    Subclasses set the rest."""

    fine_tuned: ClassVar[bool] = True
    seeded: ClassVar[bool] = True
    family: ClassVar[str] = "eval"  # one of FAMILIES
    data_block: ClassVar[str]  # the block of conf/finetune.yaml that holds its data settings
    in_glue_score: ClassVar[bool] = False
    fusable: ClassVar[bool] = False  # its runs of one task can train at once (a FineTuned's ``job``: above)
    rank: ClassVar[int] = 50  # where its column stands in tables (GLUE's tasks first)

    def __init__(self, name: str, max_seq_len: int = 128, data: DataBlock | None = None):
        self.name = name
        self.max_seq_len = int(max_seq_len)
        self._data = data

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.family not in FAMILIES:
            raise TypeError(f"{cls.__name__}.family={cls.family!r}: an evaluation's family is one of {FAMILIES}.")

    @property
    def data(self) -> DataBlock:
        """Its data settings (made by :func:`of` from a fine-tuning config)."""
        if self._data is None:
            raise ConfigError(
                f"the evaluation {self.name} was made without its data settings; make it from a fine-tuning config "
                f"(pretrainlab.evaluation.base.of(cfg)) to read its data."
            )
        return self._data

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
    def data_files(self) -> list[Path] | None:
        """The local files it reads (synthetic ones generated into the cache first); None when it reads
        the Hugging Face hub."""
        raise NotImplementedError

    def digests(self) -> dict[str, str] | None:
        """The sha256 of every file it reads (by a name that says which file), without parsing them; None
        from the hub, whose datasets are versioned. A finished result records them."""
        files = self.data_files()
        return None if files is None else {self.file_key(f): file_digest(f) for f in files}

    def file_key(self, path: Path) -> str:
        """How its results name one of its files (``RTE/dev.tsv``, ``dev.txt``)."""
        return path.name

    # --- the work -----------------------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse a recipe or data settings it cannot work with, before anything is loaded (ConfigError)."""

    def evaluate(self, run: RunContext, model: Any, fitting: Any) -> dict:
        """Evaluate ``model`` (``export.pretrained.Pretrained``) in ``run``; the fields of its results,
        ``metrics`` first. A fine-tuned evaluation trains through ``fitting``
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


class Trained(Evaluation):
    """An evaluation that trains on the encoder's outputs: the encoder with a head (:class:`FineTuned`),
    or probes on its frozen features. Its recipe adds the optimiser's ``lr`` and ``weight_decay``, the
    batch size and the epochs."""

    def __init__(
        self,
        name: str,
        lr: float,
        batch_size: int,
        epochs: int,
        max_seq_len: int = 128,
        weight_decay: float = 0.0,
        data: DataBlock | None = None,
    ):
        super().__init__(name, max_seq_len, data)
        self.lr, self.weight_decay, self.batch_size, self.epochs = lr, weight_decay, batch_size, epochs


class FineTuned(Trained):
    """An evaluation that fine-tunes the encoder with a head on it (GLUE's tasks, NER, SQuAD): its recipe
    adds the warmup of AdamW's schedule (``lr``, ``weight_decay`` and ``warmup`` reach AdamW through the
    config's ``optim`` block) and the head's dropout."""

    def __init__(self, name: str, warmup: float = 0.0, classifier_dropout: float = 0.1, **recipe: Any):
        super().__init__(name, **recipe)
        self.warmup, self.classifier_dropout = warmup, classifier_dropout

    def job(self, run: RunContext, model: Any, fitting: Any) -> Any:
        """The fine-tuning of ``model``, ready to train (a ``finetuning.Job``), for a ``fusable`` evaluation."""
        raise NotImplementedError(f"{self.name} is not fusable: it is fine-tuned through evaluate() alone")


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(float(a) - float(b)) <= 1e-9


# --- finding them -----------------------------------------------------------------------------------------
def names() -> list[str]:
    """Every evaluation there is: the files of ``conf/task/``."""
    return sorted(p.stem for p in TASKS.glob("*.yaml"))


def _key(name: str) -> str:
    return str(name).lower().replace("-", "")


def instantiate(node: DictConfig | dict, where: str, cfg: DictConfig | None = None) -> Evaluation:
    """The evaluation a task config ``node`` names (its ``_target_``), made with the node's keys as its
    recipe and, when ``cfg`` (a composed fine-tuning config) is given, with its data block; what is not
    an evaluation is refused."""
    recipe = plain(node) if isinstance(node, DictConfig) else dict(node or {})
    target = recipe.pop("_target_", None)
    if not target:
        raise UnknownEvaluation(
            f"{where} names no evaluation class (_target_); an evaluation's config names its class, e.g. "
            f"_target_: pretrainlab.evaluation.<module>.<Class> (conf/task/*.yaml)."
        )
    try:
        cls = get_class(str(target))
    except Exception as e:  # noqa: BLE001 - Hydra wraps import errors
        raise UnknownEvaluation(
            f"{where}: _target_ {target!r} cannot be made into an evaluation ({str(e).splitlines()[0][:200]}); the "
            f"evaluation classes are: {', '.join(_classes())}."
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, Evaluation)):
        raise UnknownEvaluation(
            f"{where}: {target} is not an evaluation (a subclass of pretrainlab.evaluation.base.Evaluation)."
        )
    if cfg is not None:
        recipe["data"] = DataBlock.of(cfg.get(cls.data_block), cls.data_block, cfg.get("cache_dir"))
    try:
        return cls(**recipe)
    except TypeError as e:
        raise UnknownEvaluation(
            f"{where}: {target} cannot be made from these settings ({e}); the keys of conf/task/*.yaml are its recipe."
        ) from None


def _classes() -> list[str]:
    return sorted({str(cast(DictConfig, OmegaConf.load(p)).get("_target_")) for p in TASKS.glob("*.yaml")})


@functools.cache
def get(name: str) -> Evaluation:
    """The evaluation called ``name`` (case and dashes aside: ``SST-2`` is ``sst2``): ``conf/task/<name>.yaml``."""
    key = _key(name)
    path = TASKS / f"{key}.yaml"
    if not path.is_file():
        raise UnknownEvaluation(f"unknown evaluation task {name!r}; the tasks are: {', '.join(names())}.")
    return instantiate(cast(DictConfig, OmegaConf.load(path)), str(path.relative_to(CONF.parent)))


def of(cfg: DictConfig) -> Evaluation:
    """The evaluation of a fine-tuning config (``cfg.task``, as composed or as a suite set it), with its
    recipe and its data block: all it reads of the config."""
    task = cfg.get("task")
    if not task or "name" not in task:
        raise ConfigError("task=<name> is required (conf/task/: " + ", ".join(names()) + ").")
    return instantiate(task, f"task={task.name}", cfg)


def with_data(name: str, cfg: DictConfig) -> Evaluation:
    """The evaluation called ``name`` (the recipe of ``conf/task/<name>.yaml``) with the data block of a
    composed fine-tuning config ``cfg``: what it would read there."""
    path = TASKS / f"{get(name).name}.yaml"
    return instantiate(cast(DictConfig, OmegaConf.load(path)), str(path.relative_to(CONF.parent)), cfg)


def section_kinds(tasks: list[str]) -> list[type[Evaluation]]:
    """The classes whose :meth:`Evaluation.sections` a comparison of ``tasks`` adds, each once: the
    class that defines them (NER's and SST-2's probes share theirs)."""
    owners = (next(c for c in type(get(t)).__mro__ if "sections" in vars(c)) for t in tasks)
    return list(dict.fromkeys(owners))


def known(name: str) -> bool:
    return (TASKS / f"{_key(name)}.yaml").is_file()


def display_name(name: str) -> str:
    """CoLA, SST-2, NER, BLiMP, ...: how a task is written in tables (the name itself if unknown)."""
    return get(name).display if known(name) else name


def groups() -> dict[str, list[str]]:
    """Every entry a study's ``evals`` may hold, and the tasks it stands for (GLUE's: all nine; a study
    runs those of its ``suite.glue_tasks``)."""
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
    "FAMILIES",
    "Evaluation",
    "FineTuned",
    "RunContext",
    "Trained",
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
    "result_dirs",
    "section_kinds",
    "with_data",
]
