"""Run the evaluation suite for one encoder: every task x several seeds, resumable. Tasks are GLUE's
nine and the evaluations beyond it: ner, blimp, probe_ner, probe_sst2 (docs/evaluations.md).

    python experiments/suite.py pretrained=runs/<run>                                 # GLUE: 9 tasks, 3 seeds, hub data
    python experiments/suite.py pretrained=runs/<run> glue.data_dir=glue_data tasks=[rte,mrpc,cola,stsb,sst2]
    python experiments/suite.py pretrained=runs/<run> glue.source=synthetic seeds=[0,1] task_overrides.lr=1.0e-4
    python experiments/suite.py pretrained=runs/<run> init=scratch                    # the scratch baseline
    python experiments/suite.py pretrained=runs/<run> tasks=[blimp,ner,probe_ner] blimp.data_dir=blimp \
        ner.data_dir=conll2003

Writes <output_dir>/<task>/seed<k>.json (by default <run>/glue for GLUE's tasks, <run>/eval for the
others) and summary.{json,md}; compare encoders with experiments/compare.py. Config: conf/suite.yaml
(+ everything in conf/finetune.yaml).
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[1]
DEPRECATED = (
    "conf/glue.yaml is the old name of conf/suite.yaml (the evaluation suite is more than GLUE): it still works, "
    "and will be removed; use --config-name suite (or extend suite in your own config)."
)


@hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="suite")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from pretrainlab.runtime.early import import_wandb_first

    import_wandb_first(cfg.get("logger"))  # before torch: its first run costs 2 s less (runtime.early)
    from pretrainlab.runtime.script import rerun_command
    from pretrainlab.runtime.signals import exit_on_signal
    from pretrainlab.studies.suite import run_suite  # here: --help and --cfg answer without loading torch

    if HydraConfig.get().job.config_name == "glue":
        print(DEPRECATED, file=sys.stderr)
    with exit_on_signal("the evaluation suite", rerun_command()):
        run_suite(
            cfg,
            list(cfg.tasks),
            [int(s) for s in cfg.seeds],
            cfg.output_dir,
            OmegaConf.to_container(cfg.task_overrides, resolve=True),
        )


if __name__ == "__main__":
    sys.exit(main())
