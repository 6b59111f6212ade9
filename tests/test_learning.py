"""Each objective must learn: a tiny model, a few hundred steps on the synthetic corpus, and every
head beats its trivial baseline by a clear margin on held-out documents, by the run's own
learning checks (objectives.learning) as well as by its metrics.

Their time is their steps: a step of this encoder is compute (70 ms on one core: `model=tiny` with half
its feed-forward width, which is 0.8x the time of tiny's step and learns as fast per step), and each test
takes the steps its slowest head needs to pass its baseline with the margin asserted (half the sequence
length or half the hidden width left BERT's NSP under 0.8). Each run is made once per session
(``shared_run``) and fine-tuned again by the evaluation and SQuAD tests instead of pretraining their own."""

import os
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

# On the CPU, where a run is reproducible bit for bit: whether an objective learns does not depend on
# the device, but where a head leaves its plateau does (ELECTRA's discriminator, near 1,000 steps,
# moves with a GPU's kernels and their accumulation order).
LEARN = [
    "model=tiny",
    "model.intermediate_size=256",  # tiny's feed-forward at half width: every head passes at the same steps
    "max_seq_len=64",
    "batch_size=32",
    "logger=csv",
    "num_workers=0",
    "optim.lr=2.0e-3",
    "trainer.enable_progress_bar=false",
    "trainer.num_sanity_val_steps=0",
    "trainer.limit_val_batches=8",
    "export=true",  # the evaluation and SQuAD tests fine-tune these encoders (shared_run)
    "trainer.accelerator=cpu",
]
# ELECTRA's discriminator leaves its all-"original" plateau this early only with more replacements, and
# reliably only without dropout (the slot's recipe): with it, where it leaves moves with small numerical
# differences (test_electra_generator_and_discriminator_learn)
ELECTRA = ["objective.mask_rate=0.3", "optim.lr=1.0e-3", "model.hidden_dropout=0", "model.attention_dropout=0"]


def unigram_baseline() -> float:
    """Accuracy of always predicting the most frequent non-special token of the corpus."""
    from pretrainlab.data.corpus import SyntheticCorpus
    from pretrainlab.data.pipeline import PretrainData
    from pretrainlab.data.tokenizer import TokenizerSpec
    from pretrainlab.tokens import special_tokens

    data = PretrainData(SyntheticCorpus(), TokenizerSpec(), os.environ["PRETRAINLAB_CACHE"])
    counts = np.bincount(data.tokenized.tokens, minlength=data.tokenizer.get_vocab_size())
    counts[list(special_tokens(data.tokenizer).special_ids)] = 0
    return counts.max() / counts.sum()


def train(shared_run, objective: str, steps: int, *extra: str) -> tuple[Path, dict]:
    """The run (made once per session, read-only: other tests evaluate these encoders) and its result."""
    run_dir, result = shared_run(*LEARN, f"objective={objective}", f"max_steps={steps}", f"val_every={steps}", *extra)
    print(objective, {k: round(v, 3) for k, v in result.items() if k.startswith("val/")})
    return run_dir, result


def test_roberta_mlm_learns_far_above_the_unigram_baseline(shared_run):
    _, result = train(shared_run, "roberta", 300)
    baseline = unigram_baseline()
    assert 0.1 < baseline < 0.25
    assert result["val/mlm_acc"] > 2 * baseline, (result["val/mlm_acc"], baseline)
    # at [MASK] alone (the kept tenth is copied), beside the most frequent token of those positions
    at_mask, unigram = result["learning/mlm_acc_at_mask"], result["learning/mlm_unigram_acc"]
    assert abs(unigram - baseline) < 0.03 and at_mask > 2 * unigram, (at_mask, unigram)
    assert result["learning/mlm_acc_at_kept"] > at_mask  # copying is easier than predicting
    assert [c["status"] for c in result["learning"]] == ["past baseline"]


def test_xlnet_permutation_lm_learns_far_above_the_unigram_baseline(shared_run):
    """Every target predicted through the query stream, which never sees its own token: all of its
    accuracy is prediction from context (no copying of a kept token, as a masked LM's tenth)."""
    _, result = train(shared_run, "xlnet", 350)
    baseline = unigram_baseline()
    at_targets, unigram = result["learning/plm_acc_at_mask"], result["learning/plm_unigram_acc"]
    assert abs(unigram - baseline) < 0.03 and at_targets > 2.5 * unigram, (at_targets, unigram)
    assert at_targets < 0.8  # a row that saw its own token would copy it (near 100%)
    assert result["val/plm_acc"] == pytest.approx(at_targets, abs=0.05)
    assert result["learning/plm_loss_at_mask"] < result["learning/plm_unigram_loss"] - 1.0
    assert [c["status"] for c in result["learning"]] == ["past baseline"]


def test_causal_lm_learns_the_next_token_far_above_the_unigram_baseline(shared_run):
    _, result = train(shared_run, "clm", 150)
    baseline = unigram_baseline()
    at_next, unigram = result["learning/clm_acc_at_mask"], result["learning/clm_unigram_acc"]
    assert abs(unigram - baseline) < 0.03 and at_next > 2.5 * unigram, (at_next, unigram)
    assert result["learning/clm_loss_at_mask"] < result["learning/clm_unigram_loss"] - 1.0
    assert [c["status"] for c in result["learning"]] == ["past baseline"]


def test_the_hybrid_learns_both_its_masked_and_its_causal_head(shared_run):
    """GPT-BERT at its 1/16 causal share (a quarter here, so that 400 steps hold enough causal rows
    to measure): both the masked positions and the next tokens far above the unigram baseline."""
    _, result = train(shared_run, "gpt_bert", 400, "objective.causal_share=0.25")
    unigram = result["learning/mlm_unigram_acc"]
    assert result["learning/mlm_acc_at_mask"] > 2 * unigram and result["learning/clm_acc_at_mask"] > 2 * unigram
    assert [c["status"] for c in result["learning"]] == ["past baseline", "past baseline"]


# NSP on pairs of segments leaves chance sooner at twice the learning rate: after 600 steps at 4e-3 at
# 0.87-0.89 (BERT) and 0.88 (ALBERT), where 2e-3 had 0.86-0.91 after 800. Not so ALBERT's SOP (at 4e-3:
# 0.70-0.92 after 800, moved by when validation runs; at 2e-3: 0.67 after 800, 0.82 after 1,200) or NSP
# on single sentences (at chance, 0.49, after 600 at 4e-3). The dropout stays: without it (the slot's
# no-dropout recipe, on this post-LN encoder) at 4e-3, BERT's NSP was at 0.56 after 600 steps and ALBERT's
# masked LM collapsed to one answer at its baseline.
PAIR_LR = "optim.lr=4.0e-3"


@pytest.mark.parametrize(
    "objective, pair, steps, settings",
    [
        ("bert", "nsp", 600, [PAIR_LR]),
        ("albert", "sop", 1200, []),
        ("albert", "nsp", 600, ["objective.pair_task=nsp", PAIR_LR]),  # ALBERT Table 5's NSP row
        # RoBERTa Table 2's SENTENCE-PAIR, at the tokens per step of segment pairs (as the paper matched
        # them): at batch 32 it holds half the tokens (NSP at 0.65 after 1,200 steps of tiny), at 64 it is at
        # 0.91 after 800
        ("bert", "nsp", 800, ["objective.pair_unit=sentences", "batch_size=64"]),
    ],
)
def test_pair_objectives_learn_both_heads(shared_run, objective, pair, steps, settings):
    """Both heads past their baselines, the pair head at 0.8 or more (by the run's metrics and again from
    its checkpoint), and BERT's NSP head at chance on sentence-order pairs. The pair heads leave chance
    late, after the masked LM: each run takes the steps (and learning rate, PAIR_LR) its pair head needs
    to reach 0.85 or more on the CPU."""
    run_dir, result = train(shared_run, objective, steps, *settings)
    assert result[f"val/{pair}_acc"] >= 0.8  # chance: 0.5 (balanced labels)
    assert result["val/mlm_acc"] > 1.5 * unigram_baseline()
    assert result["learning/heads_at_baseline"] == 0, result["learning"]
    assert {c["head"]: c["status"] for c in result["learning"]}[pair.upper()] == "past baseline"
    # the intrinsic check recomputes the held-out metrics from the last checkpoint, on every val example
    from pretrainlab.studies.intrinsic import evaluate

    own = evaluate(run_dir)
    assert own[f"{pair}_acc"] >= 0.8 and own["mlm_acc"] > 1.5 * unigram_baseline()
    other = "sop" if pair == "nsp" else "nsp"
    cross = evaluate(run_dir, other)[f"{pair}_acc"]
    print(objective, f"{pair} head on {other} pairs: {cross:.3f}")
    if objective == "bert":
        # both segments of an SOP pair come from one document: BERT's head, which learns to spot a change
        # of document (topic), cannot tell their order (ALBERT, Table 5: 52.0). ALBERT's NSP head, on its
        # n-gram masking, also learns the synthetic language's discourse order (an entity chain and
        # stage markers that a swap breaks): 0.74 on SOP pairs, so it is not held to this.
        assert 0.35 < cross < 0.65, cross


def test_electra_generator_and_discriminator_learn(shared_run):
    """The generator's masked LM and the discriminator's replaced-token detection past their baselines.
    1,000 steps, each a generator and a discriminator pass: the discriminator leaves its plateau near 700."""
    # At this scale the discriminator sits on the all-"original" plateau until it has seen enough
    # replacements: with 15% masking it is still there after 1,200 steps, with 30% (and lr 1e-3) it
    # leaves it after ~700 (docs/configuration.md, "ELECTRA at small scale"). Without dropout: validated
    # every 50 steps, every assertion below held from step 700 on (AUC 0.82 at 1,000), where the same run
    # with dropout was still on the plateau at 1,000 (AUC 0.68). Sampling at temperature 2,
    # which takes the slot's recipe past it within 300 steps (docs/results/cpu-electra-escape), is no
    # shortcut here: at this lr its generator stayed at its baseline for 600 steps, and its random
    # replacements gave themselves away (the token alone at AUC 0.73-0.80, the discriminator at 0.80).
    _, result = train(shared_run, "electra", 1000, *ELECTRA)
    assert result["val/gen_mlm_acc"] > 2 * unigram_baseline()
    replaced = result["val/replaced_frac"]
    assert 0.1 < replaced < 0.3  # 30% masked, minus the generator's correct samples
    # the discriminator beats always answering "original" (accuracy 1 - replaced), and what it flags
    # is mostly replaced: precision far above chance (= the replaced fraction)
    assert result["val/rtd_acc"] > (1 - replaced) + 0.01, (result["val/rtd_acc"], 1 - replaced)
    assert result["val/rtd_precision"] > 3 * replaced, (result["val/rtd_precision"], replaced)
    assert result["val/rtd_recall"] > 0.05  # it finds a share of the replacements, not one or two
    # held out, threshold-free: replaced tokens score above original ones, and neither head is at its baseline
    assert result["learning/rtd_auc"] > 0.65 and result["learning/heads_at_baseline"] == 0, result["learning"]
    # and from the context: clearly above a detector that sees each token alone (which words get replaced)
    assert result["learning/rtd_auc"] > result["learning/rtd_token_auc"] + 0.05, result["learning"]
    assert result["learning/gen_acc_at_mask"] > 2 * result["learning/gen_unigram_acc"]


def test_spanbert_learns_its_spans_from_context_and_from_their_boundaries(shared_run):
    """Both of SpanBERT's heads far above the unigram baseline: the masked LM at span tokens, and
    the span boundary objective, which sees only the two tokens outside a span and an offset."""
    _, result = train(shared_run, "spanbert", 350)
    baseline = unigram_baseline()
    for head in ("mlm", "sbo"):
        at_mask, unigram = result[f"learning/{head}_acc_at_mask"], result[f"learning/{head}_unigram_acc"]
        assert abs(unigram - baseline) < 0.05 and at_mask > 2 * unigram, (head, at_mask, unigram)
        assert result[f"learning/{head}_loss_at_mask"] < result[f"learning/{head}_unigram_loss"] - 0.5
    assert [c["status"] for c in result["learning"]] == ["past baseline", "past baseline"]


def test_clm_then_mlm_learns_the_masked_lm_in_its_second_half(shared_run):
    """CLM for the first half of 500 steps, then MLM: at the switch the masked LM is at its baseline
    (a causal phase teaches nothing of [MASK]); at the end it is far above it."""
    import csv

    run_dir, result = train(shared_run, "clm_mlm", 500, "val_every=250")
    rows = list(csv.DictReader((run_dir / "learning.csv").open()))
    at_switch = {r["step"]: r for r in rows}["250"]
    assert at_switch["status:MLM at [MASK]"] == "at baseline", at_switch
    at_mask, unigram = result["learning/mlm_acc_at_mask"], result["learning/mlm_unigram_acc"]
    assert at_mask > 2 * unigram, (at_mask, unigram)
    assert [c["status"] for c in result["learning"]] == ["past baseline"]
