"""A study's arms: its rows, each named and made by the pretraining overrides that differ between them.

``arms`` in a study's config (``conf/ablation/*.yaml``, or ``arms={...}`` on the command line) names them
(``{bert-nsp0: [objective=bert, objective.pair_weight=0]}``); without it, ``objectives`` is the shorthand
for one arm per objective. Each arm's pretraining run of a seed is ``train.py`` composed from the arm's
objective, the study's ``pretrain`` overrides, its objective's ``objective_overrides`` and the arm's own
(:func:`pretraining_config`); what the study itself decides for every run (:data:`OWNED`) no arm may set.
"""

from __future__ import annotations

import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pretrainlab.config import ConfigError
from pretrainlab.runtime.hydra import compose, options
from pretrainlab.runtime.provenance import PRETRAINING_HOW, differences

ARM_NAME = re.compile(r"[A-Za-z0-9][\w.-]*")


MAX_ARM_NAME = 64  # a W&B tag's length


def study_arms(cfg: DictConfig) -> dict[str, list[str]]:
    """The study's rows: each arm's name and the pretraining overrides that make it, its
    ``objective=<name>`` first. ``arms`` lists them (``{bert-nsp0: [objective=bert,
    objective.pair_weight=0]}``); without it, ``objectives`` is the shorthand for one arm per objective,
    named after it. Refused, naming the cause: an objective that is not one of ``conf/objective/``, an
    arm whose name is not one safe folder name (or is ``scratch``), whose overrides are not a list of
    ``key=value`` strings or that does not name its objective exactly once."""
    known = options("objective")
    arms = cfg.get("arms")
    written = OmegaConf.to_container(cfg, resolve=False)  # the keys as written (their values may interpolate)
    assert isinstance(written, dict)
    pretrain = written.get("pretrain") or []
    if not isinstance(pretrain, list) or not all(isinstance(o, str) and "=" in o for o in pretrain):
        raise ConfigError(
            f"pretrain: a list of train.py overrides (key=value) that every run shares, e.g. [model=tiny, "
            f"max_steps=1000], got {pretrain!r}."
        )
    check_not_owned(list(pretrain), "pretrain", every_run=True)
    for objective, overrides in (written.get("objective_overrides") or {}).items():
        check_not_owned(list(overrides), f"objective_overrides.{objective}")
    if arms is not None and len(arms) == 0:
        raise ConfigError(
            "arms={} names no arm: give the arms ({name: [objective=..., ...]}), or leave arms out for one row per "
            "objective (objectives)."
        )
    if arms is None:
        objectives = list(dict.fromkeys(known if cfg.objectives == "all" else cfg.objectives))
        unknown = [str(o) for o in objectives if o not in known]
        if unknown:
            raise ConfigError(
                f"objectives: {', '.join(unknown)} {'is not an objective' if len(unknown) == 1 else 'are not objectives'}"
                f" of conf/objective/ ({', '.join(known)}); or objectives=all (conf/ablate.yaml or the command line)."
            )
        return {o: [f"objective={o}"] for o in objectives}
    if not isinstance(arms, DictConfig | dict):
        raise ConfigError(
            "arms: a mapping of each arm's name to its pretraining overrides, e.g. "
            "{bert: [objective=bert], bert-nsp0: [objective=bert, objective.pair_weight=0]}."
        )
    out: dict[str, list[str]] = {}
    for name, overrides in arms.items():
        name = str(name)
        if not ARM_NAME.fullmatch(name) or ".." in name or name == "scratch" or len(name) > MAX_ARM_NAME:
            raise ConfigError(
                f"arms: {name!r} cannot name an arm: its runs are folders <arm>-s<seed> and W&B runs tagged with it, "
                f"so a name is 1 to {MAX_ARM_NAME} letters, digits, '-', '_' or '.', starting with a letter or digit "
                f"(and not 'scratch', the baseline's row)."
            )
        items = list(overrides) if isinstance(overrides, list | tuple) or OmegaConf.is_list(overrides) else None
        if items is None or not all(isinstance(o, str) and "=" in o for o in items):
            raise ConfigError(
                f"arms.{name}: a list of train.py overrides (key=value), e.g. [objective=bert], got {overrides!r}."
            )
        objective = [o.split("=", 1)[1] for o in items if o.split("=", 1)[0] == "objective"]
        if len(objective) != 1:
            raise ConfigError(
                f"arms.{name}: name the arm's objective once (objective=<one of {', '.join(known)}>); "
                f"it names {len(objective)}."
            )
        if objective[0] not in known:
            raise ConfigError(
                f"arms.{name}: objective={objective[0]} is not one of conf/objective/ ({', '.join(known)})."
            )
        check_not_owned(items, f"arms.{name}")
        out[name] = [f"objective={objective[0]}", *(o for o in items if o.split("=", 1)[0] != "objective")]
    return out


# what the study decides for every run, and an override of a run must not: which seed (the run's folder
# and row name it), how long (budget_flops), where its files go
OWNED = {
    "seed": "the study's seeds (seeds=[...]) name and seed every run",
    "budget": "the study's budget (budget_flops) is every run's",
    "max_steps": "the study's budget (budget_flops) decides every run's length",
    "ckpt_path": "the study resumes its own runs",
    "overwrite": "the study never overwrites a run",
    "hydra": "the study decides where every run's files go",
    "arm": "the study names every run's row after its arm",
}


def check_not_owned(overrides: list[str], where: str, every_run: bool = False) -> None:
    """Refuse, in an arm's or an objective's overrides, a setting the study owns (:data:`OWNED`); in
    those of every run (``pretrain``, where the study's own config sets its length), the seed and the places."""
    for override in overrides:
        key = str(override).split("=", 1)[0].lstrip("+~")
        owner = OWNED.get(key.split(".", 1)[0])
        if owner is not None and not (every_run and key.split(".", 1)[0] in ("budget", "max_steps")):
            raise ConfigError(
                f"{where}: {override!r} sets {key}, which the study owns: {owner}. Drop it from {where}"
                + (" (seeds=[...] gives the study several seeds)." if key == "seed" else ".")
            )


def check_arm_names(overrides: list[str]) -> None:
    """Refuse an ``arms={...}`` command-line override that names one arm twice: Hydra's grammar keeps
    the last of them without a word (a config file's YAML refuses a repeated key itself); and rows given
    twice, ``objectives=`` beside ``arms=`` or ``+ablation=`` (the arms would be the rows, and the
    objectives left out without a word)."""
    keys = {o.partition("=")[0].lstrip("+~") for o in overrides}
    if "objectives" in keys and keys & {"arms", "ablation"}:
        arms = next(o for o in overrides if o.partition("=")[0].lstrip("+~") in ("arms", "ablation"))
        raise ConfigError(
            f"objectives=... and {arms.split('=', 1)[0]}=... both name the study's rows: the arms would be the rows "
            f"and objectives would be ignored. Give one of them (an arm names its objective: [objective=bert, ...])."
        )
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") != "arms" or not value.strip().startswith("{"):
            continue
        names, depth, quote, start = [], 0, "", 0
        for i, c in enumerate(value):
            if quote:
                quote = "" if c == quote else quote
            elif c in "\"'":
                quote = c
            elif c in "{[":
                depth += 1
                start = i + 1 if depth == 1 else start
            elif c in "}]":
                depth -= 1
            elif c == "," and depth == 1:
                start = i + 1
            elif c == ":" and depth == 1 and start >= 0:
                names.append(value[start:i].strip().strip("\"'"))
                start = -1
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"arms: {', '.join(twice)} named twice in {override!r}: give each arm one name.")


def run_name(arm: str, seed: int) -> str:
    """The folder (and W&B name) of the study's run of ``arm`` and ``seed``."""
    return f"{arm}-s{seed}"


def run_label(cfg) -> str:
    """How the log names a study's pretraining run: its arm (two arms of one objective told apart; the
    objective's name where the arm is the objective) and seed."""
    return f"{cfg.get('arm') or cfg.objective.name} seed {cfg.seed}"


def arm_of(run: str) -> str:
    """The arm a run's folder name (:func:`run_name`) belongs to."""
    return re.sub(r"-s\d+$", "", run)


def arm_objective(overrides: list[str]) -> str:
    """The objective an arm's overrides (``study_arms``) pretrain."""
    return overrides[0].split("=", 1)[1]


def arm_overrides(cfg: DictConfig, arm: str) -> list[str]:
    """What makes ``arm`` differ from the study's other arms: its ``objective=<name>``, that objective's
    ``objective_overrides`` (the recipe every run of it shares), then the arm's own (which win)."""
    own = study_arms(cfg)[arm]
    return [own[0], *(cfg.get("objective_overrides") or {}).get(arm_objective(own), []), *own[1:]]


def set_group(cfg: DictConfig, group: str) -> None:
    if cfg.get("logger") and "group" in cfg.logger:
        cfg.logger.group = group


def pretraining_config(
    cfg: DictConfig, arm: str, seed: int, fractions: list[float] | None = None
) -> tuple[DictConfig, dict[str, str]]:
    """The composed config (and group choices) of the study's pretraining run of ``arm`` and ``seed``:
    the arm's objective, the seed, ``pretrain``'s overrides, the rest of ``arm_overrides``, the arm's
    name when it is not its objective's (recorded in the encoder's export: its row in every
    comparison), snapshots."""
    own = arm_overrides(cfg, arm)
    objective = arm_objective(own)
    named = [f"arm={arm}"] if arm != objective else []
    overrides = [own[0], f"seed={seed}", *cfg.pretrain, *own[1:], *named]
    if fractions:
        overrides.append(f"snapshots=[{','.join(f'{f:g}' for f in fractions)}]")
    train_cfg, choices = compose("train", overrides)
    set_group(train_cfg, cfg.study)
    logger = train_cfg.get("logger")
    if arm != objective and logger and "name" in logger and "tags" in logger:  # W&B: the run by its arm, tagged
        logger.name = run_name(arm, seed)
        logger.tags = [*(logger.get("tags") or []), arm]
    train_cfg.export = True
    return train_cfg, choices


def arm_changes(cfg: DictConfig, arms: list[str], against: str) -> dict[str, list[tuple[str, Any, Any]]]:
    """What each of ``arms`` changes beside the arm ``against``: (dotted key, its value there, the
    arm's) of every setting of their pretraining configs that differs. Composed from what differs
    between arms (the objective, its ``objective_overrides``, the arm's own), without the study's
    ``pretrain`` overrides every arm shares, so that a study merged from slots (whose record keeps no
    paths) says it too. An arm of another objective changes ``objective`` (the two names), and its
    objective's settings are given beside that objective's defaults (``conf/objective/<name>.yaml``),
    since the two objectives' settings are not the same keys."""

    def composed(overrides: list[str]) -> Any:
        return OmegaConf.to_container(compose("train", overrides)[0], resolve=True)

    base = composed(arm_overrides(cfg, against))
    changes = {}
    for arm in arms:
        if arm == against:
            continue
        overrides = arm_overrides(cfg, arm)
        mine = composed(overrides)
        changed = differences(base, mine, ignore=PRETRAINING_HOW)
        if mine["objective"]["name"] != base["objective"]["name"]:
            defaults = composed(overrides[:1])["objective"]
            changed = [
                ("objective", base["objective"]["name"], mine["objective"]["name"]),
                *(c for c in changed if not c[0].startswith("objective.")),
                *differences(defaults, mine["objective"], prefix="objective", ignore=PRETRAINING_HOW),
            ]
        changes[arm] = changed
    return changes


def arms_preface(cfg: DictConfig) -> str:
    """comparison.md's opening for a study of arms: what each arm changes beside the baseline arm (the
    settings of their pretraining runs that differ), or each arm's overrides when the baseline is not
    an arm."""
    arms = study_arms(cfg)
    baseline = cfg.get("baseline")
    if baseline in arms:
        lines = [
            f"Arms: what each changes beside {baseline} (its pretraining settings that differ, {baseline}'s then the "
            f"arm's; an arm of another objective: its objective's settings beside that objective's defaults):"
        ]
        for arm, changed in arm_changes(cfg, list(arms), baseline).items():
            shown = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed) or "nothing"
            lines.append(f"- **{arm}**: {shown}")
    else:
        lines = ["Arms: each arm's pretraining overrides beside the study's own:"]
        lines += [f"- **{arm}**: {' '.join(o)}" for arm, o in arms.items()]
    return "\n".join(lines)
