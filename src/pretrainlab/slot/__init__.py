"""The whole study in one short GPU slot (docs/slot.md; ``conf/ablate_slot.yaml``).

    python -m pretrainlab.slot pack --data <dir> --out .slot/inputs.tar.xz    inputs: corpus tokenized, evaluation files
    python -m pretrainlab.slot wheels --out .slot/wheels                      what an offline GPU node lacks
    python experiments/slot.py run --inputs .slot/inputs.tar.xz --wheels .slot/wheels --seed 0 --out <dir>
    python -m pretrainlab.slot merge <dir>/slot-s0.tar.gz <dir>/slot-s1.tar.gz --out <study dir>

``inputs`` packs what the study reads, ``calibrate`` and ``plan`` turn the slot's time into one FLOP
budget per objective from throughput measured at its start, ``run`` runs the slot (the study at that
budget, every job of a phase at once on the one device), ``archive`` brings back its results and
merges several slots' into one report. This package sits above the studies it runs.
"""
