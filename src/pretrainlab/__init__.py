"""pretrainlab: pretraining-objective ablations of BERT-family encoders."""

__version__ = "0.1.0"
