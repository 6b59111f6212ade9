"""Run the evaluation suite for one encoder: every task x several seeds, resumable. Tasks are GLUE's
nine and the evaluations beyond it: ner, blimp, probe_ner, probe_sst2 (docs/evaluations.md).

    python experiments/glue.py pretrained=runs/<run>                                 # GLUE: 9 tasks, 3 seeds, hub data
    python experiments/glue.py pretrained=runs/<run> glue.data_dir=glue_data tasks=[rte,mrpc,cola,stsb,sst2]
    python experiments/glue.py pretrained=runs/<run> glue.source=synthetic seeds=[0,1] task_overrides.lr=1.0e-4
    python experiments/glue.py pretrained=runs/<run> init=scratch                    # the scratch baseline
    python experiments/glue.py pretrained=runs/<run> tasks=[blimp,ner,probe_ner] blimp.data_dir=blimp \
        ner.data_dir=conll2003

Writes <output_dir>/<task>/seed<k>.json (by default <run>/glue for GLUE's tasks, <run>/eval for the
others) and summary.{json,md}; compare encoders with experiments/compare.py. Config: conf/glue.yaml
(+ everything in conf/finetune.yaml).
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[1]


@hydra.main(version_base="1.3", config_path=str(ROOT / "conf"), config_name="glue")
def main(cfg: DictConfig) -> None:
    from pretrainlab.runtime.script import rerun_command
    from pretrainlab.runtime.signals import exit_on_signal
    from pretrainlab.studies.suite import run_suite  # here: --help and --cfg answer without loading torch

    with exit_on_signal("the GLUE suite", rerun_command()):
        run_suite(
            cfg,
            list(cfg.tasks),
            [int(s) for s in cfg.seeds],
            cfg.output_dir,
            OmegaConf.to_container(cfg.task_overrides, resolve=True),
        )


if __name__ == "__main__":
    sys.exit(main())
