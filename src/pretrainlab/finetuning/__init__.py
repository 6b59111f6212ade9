"""Fine-tuning: a pretrained (or freshly initialised) encoder on one GLUE task.

encoders.py  which encoder (a run, an export, hf:<dir>, scratch), loaded, and its identity
run.py       compose and run one (task, seed); results.json
module.py    FinetuneModule: classifier on the pooled [CLS], dev metrics per epoch
"""
