"""Studies: loops over runs that can be interrupted and re-run.

suite.py     the evaluation suite of one encoder: tasks x fine-tuning seeds
ablation.py  objectives x pretraining seeds, a suite on each encoder and on scratch, the report
"""
