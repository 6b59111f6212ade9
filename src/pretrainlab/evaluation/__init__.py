"""Evaluations: what an encoder is scored on. Each is a plugin (``base.Evaluation``) named by its
config's ``_target_`` (``conf/task/<name>.yaml``); everything else calls the contract.

    base.py     the contract, and finding an evaluation by name (get) or by a study's entry (resolve)
    run.py      one evaluation on one encoder: its results file
    results.py  results files and the checks a finished result must pass to be reported
    glue.py     GLUE's tasks: a classifier on the pooled [CLS] (data, metrics: pretrainlab.evaluation.glue)
    ner.py      named entities: a token tagger (tagging.py) on CoNLL-2003 (conll.py: files, chunks, F1)
    blimp.py    zero-shot minimal pairs, scored with the pretraining objective's own likelihood
    probes.py   frozen features of every layer, cached; linear probes, the last four, a scalar mix
"""
