"""Pretraining: one objective on the shared encoder, from a composed config to an exported encoder.

run.py      compose the run (corpus -> tokenizer -> encoder -> objective -> examples -> trainer) and run it
module.py   PretrainModule: encoder + objective, counters saved in checkpoints (training time
            included), the budget's account, logging
timing.py   StepTimer: tokens/s and data wait
"""
