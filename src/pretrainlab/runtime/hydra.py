"""Hydra, as the run scripts use it: where the configs are, composing one as the command line
would, and the choices of config groups a run was composed from."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONF = Path(__file__).resolve().parents[3] / "conf"


def choices() -> dict[str, str]:
    """The chosen config groups (objective=..., model=...) when running under Hydra; else {}."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return {
        k: str(v) for k, v in HydraConfig.get().runtime.choices.items() if not k.startswith("hydra") and v is not None
    }


def command_overrides() -> list[str]:
    """The overrides given on the command line of the running Hydra job ([] outside one)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def compose(name: str, overrides: list[str]) -> tuple[DictConfig, dict[str, str]]:
    """A config composed as the command line would compose it, and its group choices. An option of a
    config group that does not exist (``+ablation=electra_vs_mlmx``) is refused naming the options."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import MissingConfigException

    from pretrainlab.config import ConfigError

    def _compose():
        try:
            cfg = hydra_compose(name, overrides=list(overrides), return_hydra_config=True)
        except MissingConfigException:
            for override in overrides:
                group, _, option = override.lstrip("+~").partition("=")
                if option and (CONF / group).is_dir() and not (CONF / group / f"{option}.yaml").is_file():
                    raise ConfigError(
                        f"{override}: there is no conf/{group}/{option}.yaml; the options of {group} are "
                        f"{', '.join(options(group))}."
                    ) from None
            raise
        picked = {
            k: str(v) for k, v in cfg.hydra.runtime.choices.items() if not k.startswith("hydra") and v is not None
        }
        OmegaConf.set_struct(cfg, False)
        cfg.pop("hydra")
        return cfg, picked

    if GlobalHydra.instance().is_initialized():
        return _compose()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return _compose()


def options(group: str) -> list[str]:
    """The options of a config group: the YAML files in conf/<group>/."""
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


FINETUNING_GROUPS = ("task",)  # composed by finetune.py and the evaluation suite, never by train.py


def group_listing(entry: str) -> str:
    """The config groups an entry point composes, one ``group: option, ...`` line each, for its
    ``--help`` (``${pretrainlab.groups:train}`` in conf/train.yaml): pretraining leaves out the
    fine-tuning groups."""
    skip = FINETUNING_GROUPS if entry == "train" else ()
    groups = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in skip and any(p.glob("*.yaml")))
    return "\n".join(f"{g}: {', '.join(options(g))}" for g in groups)


if not OmegaConf.has_resolver("pretrainlab.groups"):
    OmegaConf.register_new_resolver("pretrainlab.groups", group_listing)


__all__ = ["CONF", "FINETUNING_GROUPS", "choices", "command_overrides", "compose", "group_listing", "options"]
