"""Evaluate a pretrained encoder on one task (conf/task/: fine-tuned, zero-shot or probed) and score it.

    python finetune.py pretrained=runs/<run> task=rte                          # GLUE from the hub
    python finetune.py pretrained=runs/<run> task=mrpc glue.data_dir=glue_data  # a local GLUE copy
    python finetune.py pretrained=runs/<run> task=cola glue.source=synthetic    # offline synthetic suite
    python finetune.py pretrained=runs/<run> task=rte init=scratch              # the no-pretraining baseline

Configs: conf/finetune.yaml and conf/task/. Results: <run dir>/results.json. For a whole suite
(several tasks and seeds, resumable) use experiments/suite.py.
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="finetune")
def main(cfg: DictConfig) -> None:
    from pretrainlab.evaluation.run import run  # here: --help and --cfg answer without loading torch

    run(cfg)


if __name__ == "__main__":
    main()
