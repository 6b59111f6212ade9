"""Pretraining: one objective on the shared encoder, from a composed config to an exported encoder.

run.py      compose the run (corpus -> tokenizer -> encoder -> objective -> examples -> trainer) and run it
module.py   PretrainModule: encoder + objective, counters saved in checkpoints, logging
timing.py   StepTimer: training time (for minute budgets), tokens/s and data wait
"""
