"""What every run script shares: the floor under pretraining, fine-tuning and studies.

hydra.py        the conf/ directory, composing configs as the command line does, group choices
settings.py     settings checked before any work: numeric ones, and the devices (world size, the
                global batch split, precision and strategy checks, compile options)
rundir.py       one run per directory (refusal, resumption, overwrite)
script.py       a run's skeleton: directory, process set-up, config, progress bar, the logger
                (W&B offline by default, CSV or none; the flat config; exit codes)
checkpoints.py  checkpoints read without code, written atomically, checked on resume
signals.py      SIGTERM / Ctrl-C: finish the step, save, exit; DataLoader workers leave it to us
wandb_runs.py   everything said to or read from W&B
early.py        W&B imported before torch by the commands that log there (its first run costs less)
malloc.py       glibc keeps freed memory between steps
"""
