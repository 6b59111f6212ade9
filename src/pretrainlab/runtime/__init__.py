"""What every run script shares: the floor under pretraining, fine-tuning and studies.

hydra.py        the conf/ directory, composing configs as the command line does, group choices
devices.py      world size, the global batch split, precision and strategy checks
settings.py     numeric settings checked before any work
rundir.py       one run per directory (refusal, resumption, overwrite)
script.py       a run's skeleton: directory, process set-up, config, logger, progress bar
checkpoints.py  checkpoints read without code, written atomically, checked on resume
signals.py      SIGTERM / Ctrl-C: finish the step, save, exit; DataLoader workers leave it to us
loggers.py      W&B (offline by default), CSV or none; the flat config; exit codes
malloc.py       glibc keeps freed memory between steps
"""
