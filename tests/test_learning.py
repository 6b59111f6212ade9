"""Each objective must learn: a tiny model, a few hundred steps on the synthetic corpus, and every
head beats its trivial baseline by a clear margin on held-out documents."""

import numpy as np

from pretrainlab.train import run
from tests.conftest import compose_train

LEARN = ["model=tiny", "max_seq_len=64", "batch_size=32", "logger=csv", "num_workers=0", "optim.lr=2.0e-3",
         "trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0", "trainer.limit_val_batches=8",
         "export=false"]


def unigram_baseline(tmp_path) -> float:
    """Accuracy of always predicting the most frequent non-special token of the corpus."""
    from pretrainlab.data.corpus import SyntheticCorpus
    from pretrainlab.data.pretrain import PretrainData
    from pretrainlab.data.tokenizer import TokenizerSpec, special_tokens
    import os

    data = PretrainData(SyntheticCorpus(), TokenizerSpec(), os.environ["PRETRAINLAB_CACHE"])
    counts = np.bincount(data.tokenized.tokens, minlength=data.tokenizer.get_vocab_size())
    counts[list(special_tokens(data.tokenizer).special_ids)] = 0
    return counts.max() / counts.sum()


def test_roberta_mlm_learns_far_above_the_unigram_baseline(tmp_path):
    result = run(compose_train(*LEARN, "objective=roberta", "max_steps=500", "val_every=500"), tmp_path)
    baseline = unigram_baseline(tmp_path)
    assert 0.1 < baseline < 0.2
    print(f"roberta: val/mlm_acc {result['val/mlm_acc']:.3f}, unigram baseline {baseline:.3f}")
    assert result["val/mlm_acc"] > 2 * baseline, (result["val/mlm_acc"], baseline)
