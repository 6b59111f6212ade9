import numpy as np
import pytest
import torch

from pretrainlab.objectives.masked_lm import MaskedLMCollator
from pretrainlab.objectives.masking import MaskingConfig, corrupt, select_tokens
from pretrainlab.tokens import SpecialTokens
from tests.conftest import scored

V = 1000
TOKENS = SpecialTokens(
    vocab_size=V, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4, is_continuation=np.zeros(V, dtype=bool)
)


def examples(n=400, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        body = rng.integers(5, V, size=int(rng.integers(20, 126))).astype(np.int32)
        mid = len(body) // 2
        out.append({"input_ids": np.concatenate([[2], body[:mid], [3], body[mid:], [3]]).astype(np.int32)})
    return out


def test_masking_statistics_over_many_tokens():
    coll = MaskedLMCollator(TOKENS, MaskingConfig())
    g = torch.Generator().manual_seed(1234)
    n_eligible = n_selected = n_mask = n_random = n_same = 0
    for start in range(0, 400, 50):
        batch_examples = examples()[start : start + 50]
        batch = coll(batch_examples, g)
        original = torch.full_like(batch["input_ids"], 0)
        for i, e in enumerate(batch_examples):
            original[i, : len(e["input_ids"])] = torch.from_numpy(e["input_ids"].astype(np.int64))
        special = original <= 4
        pos, labels = scored(batch)
        flat_orig, flat_new = original.flatten(), batch["input_ids"].flatten()
        assert not special.flatten()[pos].any(), "a special or padding token was selected"
        assert torch.equal(labels, flat_orig[pos])
        # nothing outside the selection changed
        unselected = torch.ones_like(flat_orig, dtype=torch.bool)
        unselected[pos] = False
        assert torch.equal(flat_new[unselected], flat_orig[unselected])
        n_eligible += int((~special).sum())
        n_selected += len(pos)
        n_mask += int((flat_new[pos] == 4).sum())
        same = flat_new[pos] == flat_orig[pos]
        n_same += int(same.sum())
        n_random += int(((flat_new[pos] != 4) & ~same).sum())
    assert n_eligible > 10_000
    assert abs(n_selected / n_eligible - 0.15) < 0.01
    assert abs(n_mask / n_selected - 0.8) < 0.02
    # a random replacement equals the original with probability ~1/V: "unchanged" is ~10% + that
    assert abs(n_random / n_selected - 0.1) < 0.02
    assert abs(n_same / n_selected - 0.1) < 0.02


def test_rates_are_configurable():
    coll = MaskedLMCollator(TOKENS, MaskingConfig(rate=0.4, mask_token_prob=1.0, random_token_prob=0.0))
    batch = coll(examples(100), torch.Generator().manual_seed(0))
    eligible = sum(int((e["input_ids"] > 4).sum()) for e in examples(100))
    assert abs(len(scored(batch)[0]) / eligible - 0.4) < 0.01
    assert bool((batch["input_ids"].flatten()[scored(batch)[0]] == 4).all())


def test_masks_are_reproducible_from_the_generator_and_new_per_seed():
    coll = MaskedLMCollator(TOKENS, MaskingConfig())
    a = coll(examples(20), torch.Generator().manual_seed(7))
    b = coll(examples(20), torch.Generator().manual_seed(7))
    c = coll(examples(20), torch.Generator().manual_seed(8))
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["mlm_positions"], b["mlm_positions"])
    assert not torch.equal(a["mlm_positions"], c["mlm_positions"])


def test_select_tokens_never_exceeds_eligible_and_inputs_are_not_modified():
    eligible = torch.zeros(4, 10, dtype=torch.bool)
    eligible[0, :3] = True
    eligible[1, :] = True
    sel = select_tokens(eligible, 0.99, torch.Generator().manual_seed(0))
    assert not (sel & ~eligible).any()
    assert sel[2:].sum() == 0
    ids = torch.arange(10).repeat(4, 1)
    before = ids.clone()
    corrupt(ids, sel, MaskingConfig(), 4, torch.arange(5, 10), torch.Generator().manual_seed(0))
    assert torch.equal(ids, before)


@pytest.mark.parametrize("kw", [{"rate": 0.0}, {"rate": 1.0}, {"mask_token_prob": 0.8, "random_token_prob": 0.3}])
def test_bad_masking_config_is_refused(kw):
    with pytest.raises(ValueError, match="objective\\."):
        MaskingConfig(**kw)


# --- permutation language modelling (XLNet) --------------------------------------------------------
def test_two_stream_masks_follow_the_definition_for_random_orders():
    """Built cell by cell from the definition: the content stream sees keys not later in the order
    (itself included), the query stream of a target only keys strictly earlier (never its own
    content); context comes first and sees only context; padding is never seen."""
    from pretrainlab.objectives.permutation import CONTEXT, factorisation_order, two_stream_masks

    g = torch.Generator().manual_seed(0)
    batch, seq = 6, 24
    attention = torch.ones(batch, seq, dtype=torch.long)
    attention[1, 17:] = 0
    attention[4, 9:] = 0
    eligible = attention.bool().clone()
    eligible[:, 0] = False  # [CLS]
    order = factorisation_order(eligible, 1 / 3, g)
    content, query = two_stream_masks(order, attention)
    for b in range(batch):
        real = attention[b].bool()
        targets = [i for i in range(seq) if order[b, i] >= 0]
        assert targets and all(eligible[b, i] for i in targets)
        assert sorted(order[b, targets].tolist()) == list(range(len(targets)))  # one rank each
        for q in range(seq):
            for k in range(seq):
                want_content = bool(real[k]) and int(order[b, k]) <= int(order[b, q])
                assert bool(content[b, q, k]) == want_content, (b, q, k)
                if order[b, q] >= 0:
                    assert bool(query[b, q, k]) == (bool(real[k]) and int(order[b, k]) < int(order[b, q]))
                else:
                    assert bool(query[b, q, k]) == want_content
        for q in targets:
            assert not query[b, q, q] and content[b, q, q]  # never its own content in the query stream
            assert query[b, q].any()  # the context ([CLS] at least) is always there to attend
            later = [k for k in targets if order[b, k] > order[b, q]]
            assert not content[b, q, later].any() and not query[b, q, later].any()
        context = [i for i in range(seq) if order[b, i] == CONTEXT and real[i]]
        assert all(not content[b, q, targets].any() for q in context)  # context never sees a target


def test_permutation_predicts_one_in_k_and_orders_targets_uniformly():
    """Over 4000 rows of 64 eligible tokens (seeded): the predicted fraction is 1/K (K = 6), each
    row predicting floor or ceil of 64/K; the first target in the order is at each of a row's
    target positions equally often."""
    from pretrainlab.objectives.permutation import factorisation_order

    g = torch.Generator().manual_seed(1)
    eligible = torch.ones(4000, 64, dtype=torch.bool)
    order = factorisation_order(eligible, 1 / 6, g)
    counts = (order >= 0).sum(dim=1)
    assert set(counts.tolist()) == {10, 11} and abs(counts.float().mean().item() / 64 - 1 / 6) < 0.002
    rows = counts == 11  # where the first-ranked target sits among a row's targets, left to right
    first = torch.stack([(o[o >= 0] == 0).nonzero().squeeze() for o in order[rows]])
    share = torch.bincount(first, minlength=11).float() / len(first)
    assert len(first) > 2000 and (share - 1 / 11).abs().max() < 0.025, share
    with pytest.raises(ValueError, match="must be in"):
        factorisation_order(eligible[:2], 1.0, g)


def test_permutation_masks_agree_with_transformers_where_the_definitions_coincide():
    """transformers' DataCollatorForPermutationLanguageModeling picks its targets in spans and orders
    them its own way, and lets special tokens' rows see some targets; on every other row the two
    definitions coincide: a position cannot see a target not earlier than itself in the order. The
    order its perm_mask implies (a target's rank = the targets it sees) through our two_stream_masks
    gives its perm_mask exactly, on 64 sequences."""
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    from pretrainlab.objectives.permutation import CONTEXT, two_stream_masks

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(95))])}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="[UNK]")),
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    torch.manual_seed(0)
    collator = transformers.DataCollatorForPermutationLanguageModeling(
        tokenizer, plm_probability=1 / 6, max_span_length=5
    )
    ids = torch.randint(5, 100, (64, 32))
    ids[:, 0], ids[:, -1] = 2, 3  # [CLS] ... [SEP]
    _, perm_mask, _, labels = collator.torch_mask_tokens(ids.clone())
    theirs = perm_mask == 0  # True: may attend
    targets = labels != -100
    assert targets.any(1).all()
    order = torch.where(targets, (theirs & targets[:, None, :]).sum(2), torch.full_like(ids, CONTEXT))
    content, query = two_stream_masks(order, torch.ones_like(ids))
    ordinary = ~torch.isin(ids, torch.tensor([2, 3]))  # the rows where the definitions coincide
    assert torch.equal(query[ordinary], theirs[ordinary])
    # the content stream is the query stream plus each position's own content (XLNet's non_tgt_mask)
    eye = torch.eye(32, dtype=torch.bool).expand(64, 32, 32)
    assert torch.equal(content[ordinary], (theirs | eye)[ordinary])
    # a rank each, as an order must give
    for row, t in zip(order, targets):
        assert sorted(row[t].tolist()) == list(range(int(t.sum())))


def test_whole_word_masking_predicts_every_piece_of_a_chosen_word_at_the_rate():
    """RoBERTa's collator with whole_word: over 2,000 rows of WordPiece-like ids (a third of the vocabulary
    continuation pieces): every chosen word is chosen whole and the predicted share of the eligible
    tokens is the rate (15%, within 0.004); without it, words are split."""
    from pretrainlab.objectives.masking import word_spans

    vocab = 300
    continuation = np.zeros(vocab, dtype=bool)
    continuation[200:] = True  # ids 200-299 are ##pieces
    tokens = SpecialTokens(vocab, 0, 1, 2, 3, 4, continuation)
    rng = np.random.default_rng(0)
    examples = [{"input_ids": np.array([2, *rng.integers(5, vocab, 60), 3])} for _ in range(2000)]
    for e in examples:
        e["input_ids"][1] = 5  # a row starts with a word's first piece
    split = {}
    for whole in (True, False):
        collate = MaskedLMCollator(tokens, MaskingConfig(0.15, 0.8, 0.1, whole_word=whole))
        batch = collate(examples, torch.Generator().manual_seed(1))
        positions, labels = batch["mlm_positions"], batch["mlm_labels"]
        chosen = torch.zeros(batch["input_ids"].shape, dtype=torch.bool)
        chosen.scatter_(1, positions, labels != -100)
        ids = torch.stack([torch.as_tensor(e["input_ids"]) for e in examples])
        eligible = ids > 4
        assert abs(chosen.sum().item() / eligible.sum().item() - 0.15) < 0.004
        broken = 0
        for row in range(len(examples)):
            starts, ends = word_spans(eligible[row].numpy(), continuation[ids[row].numpy()])
            for a, b in zip(starts, ends):
                broken += 0 < int(chosen[row, a:b].sum()) < b - a
        split[whole] = broken
    assert split[True] == 0 and split[False] > 1000, split


def test_the_hybrid_mixes_causal_examples_at_its_share_and_leaves_them_uncorrupted():
    """GPT-BERT's collator over 1,500 batches of 32 (seeded): the causal share is 1/16 in expectation
    (stochastically rounded per batch); a causal row is shown as it is, predicts every next token and
    nothing masked; a masked row is RoBERTa's (15% predicted) and predicts no next token."""
    from pretrainlab.model.heads import IGNORE
    from pretrainlab.objectives.gpt_bert import HybridCollator

    tokens = SpecialTokens(300, 0, 1, 2, 3, 4, np.zeros(300, dtype=bool))
    collate = HybridCollator(tokens, MaskingConfig(0.15, 0.8, 0.1), causal_share=1 / 16)
    rng = np.random.default_rng(0)
    g = torch.Generator().manual_seed(0)
    causal_rows = total_rows = masked_predicted = masked_eligible = 0
    for _ in range(1500):
        examples = [
            {"input_ids": np.array([2, *rng.integers(5, 300, int(rng.integers(10, 40))), 3])} for _ in range(32)
        ]
        batch = collate(examples, g)
        causal = batch["causal"]
        k = int(causal.sum())
        assert k in (0, 1, 2)  # floor or ceil of 32 / 16
        causal_rows, total_rows = causal_rows + k, total_rows + 32
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            if causal[i]:
                assert batch["input_ids"][i, :n].tolist() == e["input_ids"].tolist()
                assert (batch["mlm_labels"][i] == IGNORE).all()
                assert batch["clm_labels"][i, : n - 1].tolist() == e["input_ids"][1:].tolist()
            else:
                assert (batch["clm_labels"][i] == IGNORE).all()
                masked_predicted += int((batch["mlm_labels"][i] != IGNORE).sum())
                masked_eligible += n - 2
    assert abs(causal_rows / total_rows - 1 / 16) < 0.004, causal_rows / total_rows
    assert abs(masked_predicted / masked_eligible - 0.15) < 0.003


def test_a_masking_rate_schedule_moves_linearly_from_its_start_to_its_rate():
    """mask_rate_start -> mask_rate over the run (Ankner et al., 2024: 0.3 -> 0.15): over 120 batches
    of 32 rows at each point, the predicted share of the eligible tokens is the rate there (within
    0.004), and with a fixed length every batch keeps the slots of the schedule's peak."""
    from pretrainlab.objectives.masking import max_selected

    masking = MaskingConfig(0.15, 0.8, 0.1, rate_start=0.3)
    assert masking.scheduled and masking.peak_rate == 0.3
    assert [masking.at(p).rate for p in (0.0, 0.5, 1.0, 2.0)] == pytest.approx([0.3, 0.225, 0.15, 0.15])
    assert not MaskingConfig(0.15).scheduled and not MaskingConfig(0.15, rate_start=0.15).scheduled
    with pytest.raises(ValueError, match="mask_rate_start must be in"):
        MaskingConfig(0.15, rate_start=1.5)
    collate = MaskedLMCollator(TOKENS, masking, length=128)
    resolved = collate.at(0.3)
    assert resolved.at(0.9) is resolved  # a collator at a point of the run is constant
    rng = np.random.default_rng(0)
    for progress, rate in ((0.0, 0.3), (0.5, 0.225), (1.0, 0.15)):
        g = torch.Generator().manual_seed(7)
        predicted = eligible = 0
        for _ in range(120):
            examples = [{"input_ids": np.array([2, *rng.integers(5, V, 100), 3])} for _ in range(32)]
            batch = collate.at(progress)(examples, g)
            assert batch["mlm_positions"].shape == (32, max_selected(128, 0.3))
            predicted += int((batch["mlm_labels"] != -100).sum())
            eligible += 32 * 100
        assert abs(predicted / eligible - rate) < 0.004, (progress, predicted / eligible)


def test_scheduled_batches_are_made_at_their_optimizer_steps_place_in_the_run():
    """Each training batch is made by the collator at its optimizer step's progress: steps count on
    across epochs (21 per epoch here) and are shared by the micro-batches of an accumulation."""
    from pretrainlab.data.batches import EpochBatches, MaskedBatches
    from pretrainlab.optim import StepProgress

    class Recorder:
        def at(self, progress):
            return lambda examples, generator: {"progress": progress, "n": len(examples)}

    sampler = EpochBatches(21 * 8, 4, seed=0, accumulate=2)
    dataset = MaskedBatches(list(range(21 * 8)), Recorder(), seed=0, progress=StepProgress(30))
    made = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        made += [(key.step, dataset[key]["progress"]) for key in sampler]
    steps = [s for s, _ in made]
    assert steps == [s for s in range(42) for _ in range(2)]  # two micro-batches per step, epochs follow on
    assert [p for _, p in made] == [min(1.0, s / 30) for s in steps]
    sampler.resume_at(2 * 5)  # a run resumed at step 5 of an epoch carries on with step 5's batches
    assert next(iter(sampler)).step == 21 + 5


def test_clm_then_mlm_trains_causal_examples_first_then_masked_ones():
    """GPT-BERT's two phases (causal_first = 0.5, share 0 after): before half the run every row is
    causal (uncorrupted, next tokens); after it the batch is RoBERTa's (15% predicted, no causal
    rows); the collator as it is, and validation, are the run's end."""
    from pretrainlab.model.heads import IGNORE
    from pretrainlab.objectives.gpt_bert import HybridCollator

    collate = HybridCollator(TOKENS, MaskingConfig(0.15, 0.8, 0.1), causal_share=0.0, causal_first=0.5)
    rows = examples(64)
    early = collate.at(0.49)(rows, torch.Generator().manual_seed(0))
    assert early["causal"].all() and (early["mlm_labels"] == IGNORE).all()
    for i, e in enumerate(rows):
        n = len(e["input_ids"])
        assert early["input_ids"][i, :n].tolist() == e["input_ids"].tolist()
    for late in (collate.at(0.5), collate):
        batch = late(rows, torch.Generator().manual_seed(0))
        assert "causal" not in batch and "clm_labels" not in batch
        predicted = int((batch["mlm_labels"] != IGNORE).sum())
        eligible = sum(len(e["input_ids"]) - 3 for e in rows)  # [CLS] and two [SEP] per row
        assert abs(predicted / eligible - 0.15) < 0.01
