"""Pretrain the shared encoder with one objective.

    python train.py                                   # RoBERTa on the embedded synthetic corpus
    python train.py objective=electra model=mini
    python train.py data=text data.files=[books/]     # your own .txt / .jsonl / .parquet files
    python train.py -m objective=bert,albert,roberta,electra seed=0,1

Configs live in conf/ (see conf/train.yaml); every run writes to its own directory under runs/.
"""

import hydra
from omegaconf import DictConfig

import pretrainlab.runtime.hydra  # noqa: F401  (the resolver --help uses)


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from pretrainlab.runtime.early import import_wandb_first

    import_wandb_first(cfg.get("logger"))  # before torch: its first run costs 2 s less (runtime.early)
    from pretrainlab.pretraining.run import run  # here: --help and --cfg answer without loading torch

    run(cfg)


if __name__ == "__main__":
    main()
