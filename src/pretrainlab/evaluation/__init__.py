"""Evaluations: what an encoder is scored on. Each is a plugin (``base.Evaluation``) named by its
config's ``_target_`` (``conf/task/<name>.yaml``); everything else calls the contract.

    base.py        the contract, and finding an evaluation by name (get) or by a study's entry (resolve)
    data.py        what every evaluation's data shares: its settings block, the synthetic-set base
    finetuning.py  the loop every fine-tuned head shares (Trainable, Job, Fitting)
    run.py         one evaluation on one encoder: its results file
    results.py     results files and the checks a finished result must pass to be reported
    glue/          GLUE's tasks: a classifier on the pooled [CLS]; their files, metrics and synthetic suite
    ner.py         named entities: a token tagger (tagging.py) on CoNLL-2003 (conll.py: files, chunks, F1)
    squad.py       extractive question answering: a span head, SQuAD's windows and scores
    blimp.py       zero-shot minimal pairs, scored with the pretraining objective's own likelihood
    probes.py      frozen features of every layer, cached; linear probes, the last four, a scalar mix
"""
