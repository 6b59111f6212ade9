"""Fine-tuning machinery that every fine-tuned evaluation shares (``pretrainlab.evaluation``):

encoders.py  which encoder (a run, an export, hf:<dir>, scratch), loaded, and its identity
module.py    Trainable: the LightningModule base of every fine-tuned head (optimizer, dev metrics per epoch)
loop.py      Job and Fitting: train a head with its encoder for task.epochs, evaluating after each
"""
