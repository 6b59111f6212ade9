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
