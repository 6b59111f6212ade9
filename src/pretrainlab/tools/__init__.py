"""The tools that measure and check the rest: speed (``bench``, ``profile_step``) and independent
implementations to compare against (``reference``: a run's pretraining beside transformers' model of the
same shape; ``glue_reference`` and ``squad_reference``: fine-tuning beside transformers' recipes). Each is
a module with ``main(argv)``, run as ``python -m pretrainlab.tools.<name>`` or through its thin entry
point in ``experiments/``; they sit above everything they measure.
"""
