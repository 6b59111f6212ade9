"""A pretraining-objective ablation from one command: pretrain -> evaluation suite -> comparison.

    python experiments/ablate.py                              # all four objectives (conf/ablate.yaml)
    python experiments/ablate.py --config-name ablate_quick   # a small offline study (synthetic data)
    python experiments/ablate.py study=mine objectives=[roberta,electra] \\
        'pretrain=["model=tiny","max_steps=300"]' \\
        'suite.overrides=["glue.source=synthetic"]' suite.seeds=[0,1]

Resumable: re-run the same command and finished pretraining runs and (task, seed) pairs are
skipped. Output: runs/studies/<study>/ (pretrain/<objective>-s<seed>/, report/).
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

ROOT = Path(__file__).resolve().parents[1]


@hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="ablate")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from pretrainlab.runtime.early import chooses_wandb, import_wandb_first

    # before torch: the first W&B run of a process costs 2 s less (runtime.early)
    import_wandb_first(chooses_wandb(cfg.get("pretrain"), (cfg.get("suite") or {}).get("overrides")))
    from pretrainlab.studies.ablation import run_study  # here: --help and --cfg answer without loading torch
    from pretrainlab.studies.arms import check_arm_names

    check_arm_names(list(HydraConfig.get().overrides.task))
    run_study(cfg)


if __name__ == "__main__":
    sys.exit(main())
