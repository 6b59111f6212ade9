"""Evaluations beyond GLUE, in the same suite and comparison: zero-shot minimal pairs (BLiMP), named
entities (token classification, CoNLL-2003) and frozen-feature probes.

    tasks.py    every evaluation task (GLUE's nine and these), its kind, metrics and data settings
    run.py      one task on one encoder: dispatches on the task's kind, writes its results file
    blimp.py    minimal pairs: readers, the synthetic pairs, scoring with the objective's own likelihood
    ner.py      CoNLL files (IOB1 / IOB2), entity chunks and F1 as conlleval counts them, the synthetic task
    tagging.py  fine-tuning a token classifier (the first sub-word of each word)
    probes.py   frozen features of every layer, cached; linear probes, the last four, a scalar mix
"""
