"""Example building and masking of the objectives, with fixed seeds over enough samples."""

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from pretrainlab.config import ConfigError
from pretrainlab.data.sentence_pairs import SentencePairs
from pretrainlab.model.encoder import Encoder, EncoderConfig, count_parameters
from pretrainlab.objectives.albert import NgramMaskingCollator
from pretrainlab.objectives.bert import BERT
from pretrainlab.objectives.electra import ELECTRA
from pretrainlab.objectives.masking import MaskingConfig, ngram_probs, ngram_spans, word_spans
from pretrainlab.tokens import SpecialTokens
from tests.conftest import CONF, compose_train, scored

CLS, SEP = 2, 3


def tagged_documents(n_docs=300, seed=0):
    """Token t encodes (document, sentence, position): every example can be traced back."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(n_docs):
        sentences = []
        for s in range(int(rng.integers(4, 15))):
            length = int(rng.integers(3, 20))
            sentences.append((10_000_000 + d * 10_000 + s * 100 + np.arange(length)).astype(np.int64))
        docs.append(sentences)
    return docs


def decode(token):
    t = int(token) - 10_000_000
    return t // 10_000, (t % 10_000) // 100


def segments(example):
    ids, types = example["input_ids"], example["token_type_ids"]
    assert ids[0] == CLS and ids[-1] == SEP
    sep = np.flatnonzero(ids == SEP)
    assert len(sep) == 2 and types[: sep[0] + 1].max() == 0 and types[sep[0] + 1 :].min() == 1
    return ids[1 : sep[0]], ids[sep[0] + 1 : -1]


@pytest.mark.parametrize("task", ["nsp", "sop"])
def test_pair_labels_are_balanced_and_shapes_right(task):
    examples = list(SentencePairs(128, CLS, SEP, task)(tagged_documents(2500), np.random.default_rng(0)))
    labels = np.array([int(e["label"]) for e in examples])
    assert len(examples) > 2500  # the std of the label mean is then <= 1 point: 3 points is 3 sigma
    assert abs(labels.mean() - 0.5) < 0.03
    assert all(len(e["input_ids"]) <= 128 for e in examples)
    lengths = [len(e["input_ids"]) for e in examples]
    assert np.mean(np.array(lengths) < 64) < 0.5  # mostly filled; a few are short on purpose


def test_nsp_negatives_come_from_another_document_and_positives_continue():
    for e in SentencePairs(128, CLS, SEP, "nsp")(tagged_documents(), np.random.default_rng(1)):
        a, b = segments(e)
        doc_a, doc_b = {decode(t)[0] for t in a}, {decode(t)[0] for t in b}
        assert len(doc_a) == 1 and len(doc_b) == 1
        if e["label"] == 1:
            assert doc_a != doc_b
        else:
            assert doc_a == doc_b and a.max() < b.min()  # tagged ids grow through a document: B follows A


def test_sop_pairs_are_consecutive_segments_of_one_document_swapped_half_the_time():
    for e in SentencePairs(128, CLS, SEP, "sop")(tagged_documents(), np.random.default_rng(2)):
        a, b = segments(e)
        assert len({decode(t)[0] for t in np.concatenate([a, b])}) == 1
        first, second = (b, a) if e["label"] == 1 else (a, b)
        # in order: the first segment ends before the second begins (tagged ids grow through a document)
        assert first.max() < second.min()


def test_nsp_keeps_unused_sentences_and_truncates_the_longer_segment():
    docs = tagged_documents(200, seed=3)
    examples = list(SentencePairs(64, CLS, SEP, "nsp", short_seq_prob=0.0)(docs, np.random.default_rng(3)))
    # sentences put back after a random B start the next chunk: every sentence of a document shows up in A or B
    used = set()
    for e in examples:
        a, b = segments(e)
        used |= {decode(t) for t in (a if e["label"] == 1 else np.concatenate([a, b]))}
    all_sentences = {(d, s) for d, doc in enumerate(docs) for s in range(len(doc))}
    assert len(used & all_sentences) / len(all_sentences) > 0.9
    assert max(len(e["input_ids"]) for e in examples) == 64


def whole_sentence(segment, docs):
    """The (document, sentence) ``segment`` is, when it is exactly one sentence of ``docs``, else None."""
    where = {decode(t) for t in segment}
    if len(where) != 1:
        return None
    d, s = where.pop()
    return (d, s) if np.array_equal(segment, docs[d][s]) else None


@pytest.mark.parametrize("task", ["nsp", "sop"])
def test_sentence_pairs_are_two_whole_sentences_with_balanced_labels(task):
    """RoBERTa's SENTENCE-PAIR: A and B are one whole sentence each (the tagged sentences are short
    enough that nothing is truncated); NSP's positives are a sentence and the next one, its negatives
    a sentence of another document; SOP's pairs are consecutive, swapped half the time."""
    docs = tagged_documents(2500, seed=5)
    examples = list(SentencePairs(128, CLS, SEP, task, unit="sentences")(docs, np.random.default_rng(5)))
    assert len(examples) > 5000
    labels = np.array([int(e["label"]) for e in examples])
    assert abs(labels.mean() - 0.5) < 0.02  # std of the mean <= 0.7 points: 2 points is ~3 sigma
    for e in examples:
        a, b = (whole_sentence(x, docs) for x in segments(e))
        assert a is not None and b is not None
        if task == "nsp" and e["label"] == 1:
            assert a[0] != b[0]
        else:
            first, second = (b, a) if e["label"] == 1 else (a, b)
            assert first[0] == second[0] and second[1] == first[1] + 1
    # every sentence with a next one starts a pair or ends a positive one (NSP puts a negative's real
    # next sentence back); none is cut
    if task == "nsp":
        used = {whole_sentence(x, docs) for e in examples for x in segments(e)[: 1 + (e["label"] == 0)]}
        assert used >= {(d, s) for d, doc in enumerate(docs) for s in range(len(doc) - 1)}


def test_sentence_pairs_truncate_a_long_pair_to_fit():
    docs = [[np.arange(10, 60), np.arange(100, 180)], [np.arange(200, 260), np.arange(300, 340)]]
    for e in SentencePairs(32, CLS, SEP, "sop", unit="sentences")(docs, np.random.default_rng(0)):
        assert len(e["input_ids"]) == 32


def test_a_pair_unit_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="unit must be one of segments, sentences"):
        SentencePairs(128, CLS, SEP, "nsp", unit="sentence")
    with pytest.raises(ConfigError, match="objective.pair_unit='paragraphs' is not a pair unit"):
        build_objective_from("objective=bert", "objective.pair_unit=paragraphs")


def test_albert_trains_next_sentence_prediction_on_its_own_masking_when_asked():
    """ALBERT Table 5's NSP row: the n-gram masking of ALBERT, BERT's pair task (its pairs, its head's
    metric names and its learning check)."""
    from pretrainlab.objectives.albert import NgramMaskingCollator

    albert = build_objective_from("objective=albert", "objective.pair_task=nsp")
    assert albert.pair_task == "nsp" and albert.example_builder(64).task == "nsp"
    assert isinstance(albert.collator(), NgramMaskingCollator)
    from tests.conftest import random_documents

    examples = list(albert.example_builder(64)(random_documents(50), np.random.default_rng(0)))
    batch = albert.collator()(examples[:8], torch.Generator().manual_seed(0))
    out = albert(Encoder(TINY), batch)
    assert {"nsp_loss", "nsp_acc"} <= set(out.metrics) and "sop_acc" not in out.metrics
    assert build_objective_from("objective=albert").example_builder(64).task == "sop"
    with pytest.raises(ConfigError, match="objective.pair_task='mlm' is not a pair task"):
        build_objective_from("objective=albert", "objective.pair_task=mlm")


def test_a_pair_head_without_its_loss_is_reported_but_not_judged():
    """pair_weight=0 (the "none" row of a pair-loss ablation): the untrained pair head's accuracy is in
    the metrics, and no learning check calls the run's design a failure to learn."""
    from pretrainlab.objectives import learning
    from tests.conftest import random_documents

    for weight, heads in (("1.0", ["MLM at [MASK]", "NSP"]), ("0", ["MLM at [MASK]"])):
        bert = build_objective_from("objective=bert", f"objective.pair_weight={weight}")
        bert.token_counts = np.ones(500)
        examples = list(bert.example_builder(64)(random_documents(50), np.random.default_rng(0)))
        batch = bert.collator()(examples[:16], torch.Generator().manual_seed(0))
        metrics, checks = bert.learning(learning.to_host(bert.tally(Encoder(TINY), batch)))
        assert [c.head for c in checks] == heads and "nsp_acc" in metrics


TINY = EncoderConfig(vocab_size=500, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def build_objective_from(*overrides):
    from pretrainlab.pretraining.assembly import build_objective

    tokens = SpecialTokens(500, 0, 1, 2, 3, 4, np.zeros(500, dtype=bool))
    return build_objective(compose_train(*overrides), TINY, tokens)


def words_row(rng, n_words, piece_probs=(0.8, 0.15, 0.05)):
    """A row of word pieces, with English-like WordPiece splits (most words one piece): ids and
    continuation flags (piece ids >= 500 continue a word)."""
    ids, cont = [CLS], [False]
    for _ in range(n_words):
        k = int(rng.choice(len(piece_probs), p=piece_probs)) + 1
        ids += [int(rng.integers(5, 500))] + [int(rng.integers(500, 1000)) for _ in range(k - 1)]
        cont += [False] + [True] * (k - 1)
    return ids + [SEP], cont + [False]


def test_ngram_lengths_follow_the_one_over_n_law():
    rng = np.random.default_rng(0)
    counts = np.zeros(3)
    g = torch.Generator().manual_seed(0)
    for _ in range(400):  # sequences of ~512 tokens, as ALBERT pretrains
        ids, cont = words_row(rng, 400)
        elig = np.array([i not in (CLS, SEP) for i in ids])
        starts, ends = word_spans(elig, np.array(cont))
        for _, n in ngram_spans(starts, ends, to_mask=int(0.15 * elig.sum()), max_n=3, generator=g):
            counts[n - 1] += 1
    observed = counts / counts.sum()
    assert counts.sum() > 10_000
    np.testing.assert_allclose(ngram_probs(3), [0.5454, 0.2727, 0.1818], atol=1e-3)
    assert np.all(np.abs(observed - ngram_probs(3)) < 0.02), observed


def test_ngram_masking_never_splits_words_and_respects_the_budget():
    rng = np.random.default_rng(1)
    vocab = 1000
    continuation = np.zeros(vocab, dtype=bool)
    continuation[500:] = True
    tokens = SpecialTokens(vocab, 0, 1, CLS, SEP, 4, continuation)
    coll = NgramMaskingCollator(tokens, MaskingConfig(), max_ngram=3)
    examples = [
        {"input_ids": np.array(words_row(rng, int(rng.integers(10, 60)))[0], dtype=np.int32)} for _ in range(400)
    ]
    g = torch.Generator().manual_seed(0)
    selected_total = eligible_total = 0
    for i in range(0, 400, 50):
        batch = coll(examples[i : i + 50], g)
        ids = torch.zeros_like(batch["input_ids"])
        for r, e in enumerate(examples[i : i + 50]):
            ids[r, : len(e["input_ids"])] = torch.from_numpy(e["input_ids"].astype(np.int64))
        selected = torch.zeros(ids.numel(), dtype=torch.bool)
        selected[scored(batch)[0]] = True
        selected = selected.view_as(ids)
        cont = torch.from_numpy(continuation)[ids]
        # a continuation piece is selected exactly when the piece before it is
        prev = torch.cat([torch.zeros_like(selected[:, :1]), selected[:, :-1]], dim=1)
        assert torch.equal(selected[cont], prev[cont])
        assert not selected[(ids == CLS) | (ids == SEP) | (ids == 0)].any()
        eligible = ((ids != CLS) & (ids != SEP) & (ids != 0)).sum(dim=1)
        assert (selected.sum(dim=1) <= torch.floor(eligible * 0.15) + 1).all()  # never over the budget
        selected_total += int(selected.sum())
        eligible_total += int(eligible.sum())
    assert 0.13 < selected_total / eligible_total <= 0.151


def test_albert_preset_has_hugging_face_parameter_count():
    cfg = compose_train("model=albert_base", "model.vocab_size=30000", "objective=albert")
    assert count_parameters(instantiate(cfg.model)) == 11_683_584


def test_electra_small_preset_has_hugging_face_parameter_count_and_a_quarter_width_generator():
    cfg = instantiate(compose_train("model=electra_small", "model.vocab_size=30522").model)
    assert count_parameters(cfg) == 13_483_008
    gen = cfg.scaled(0.25)
    assert (gen.hidden_size, gen.num_layers, gen.num_heads, gen.intermediate_size) == (64, 12, 1, 256)


def electra_setup(vocab=200):
    tokens = SpecialTokens(vocab, 0, 1, CLS, SEP, 4, np.zeros(vocab, dtype=bool))
    cfg = EncoderConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=2)
    return tokens, cfg, ELECTRA(cfg, tokens), Encoder(cfg)


def test_electra_labels_are_exact_and_the_generator_shares_the_embeddings():
    tokens, cfg, obj, enc = electra_setup()
    rng = np.random.default_rng(0)
    examples = [
        {"input_ids": np.concatenate([[CLS], rng.integers(5, 200, 40), [SEP]]).astype(np.int32)} for _ in range(64)
    ]
    batch = obj.collator()(examples, torch.Generator().manual_seed(0))
    captured = {}
    real_disc = obj.discriminator_head.forward

    def spy(hidden):
        captured["hidden"] = hidden
        return real_disc(hidden)

    obj.discriminator_head.forward = spy
    captured_ids = {}
    real_forward = enc.forward

    def enc_spy(ids, *a, **k):
        captured_ids.setdefault("ids", ids)
        return real_forward(ids, *a, **k)

    enc.forward = enc_spy
    out = obj(enc, batch)
    disc_ids = captured_ids["ids"].flatten()
    from pretrainlab.objectives.base import pad_examples

    original = pad_examples(examples, tokens.pad_id)["input_ids"].flatten()
    replaced = disc_ids != original
    # only masked positions may change, and a position is labelled replaced iff its token differs
    outside = torch.ones_like(replaced)
    outside[scored(batch)[0]] = False
    assert not replaced[outside].any()
    real = original != tokens.pad_id
    assert abs(float(out.metrics["replaced_frac"]) - float(replaced[real].float().mean())) < 1e-6
    # the generator has no embeddings of its own; its gradient reaches the shared ones
    assert obj.generator.embeddings is None
    assert not any("word_embeddings" in n for n, _ in obj.named_parameters())
    out.loss.backward()
    assert enc.embeddings.word_embeddings.weight.grad is not None
    assert obj.generator.layers[0].attention.qkv.weight.grad is not None


def test_electra_masking_is_85_percent_mask_15_percent_unchanged():
    tokens, cfg, obj, enc = electra_setup()
    rng = np.random.default_rng(0)
    examples = [
        {"input_ids": np.concatenate([[CLS], rng.integers(5, 200, 120), [SEP]]).astype(np.int32)} for _ in range(100)
    ]
    batch = obj.collator()(examples, torch.Generator().manual_seed(0))
    positions, labels = scored(batch)
    at = batch["input_ids"].flatten()[positions]
    assert len(at) > 1500
    assert abs(float((at == 4).float().mean()) - 0.85) < 0.02
    assert torch.equal(at[at != 4], labels[at != 4])


def test_pair_objectives_need_a_pooler():
    tokens = SpecialTokens(100, 0, 1, 2, 3, 4, np.zeros(100, dtype=bool))
    with pytest.raises(ConfigError, match="model.add_pooler=true"):
        BERT(EncoderConfig(vocab_size=100, hidden_size=32, num_layers=1, num_heads=2, add_pooler=False), tokens)


def test_every_objective_reports_flops_and_electra_counts_its_generator():
    tokens = SpecialTokens(1000, 0, 1, 2, 3, 4, np.zeros(1000, dtype=bool))
    cfg = EncoderConfig(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=2)
    enc = Encoder(cfg)
    from pretrainlab.objectives.roberta import RoBERTa

    roberta = RoBERTa(cfg, tokens).flops_per_token(cfg, 128)
    electra = ELECTRA(cfg, tokens).flops_per_token(cfg, 128)
    # the last layer runs at the masked rows only (and [CLS], for the pooler); the head adds its own
    assert roberta > enc.flops_per_token(128, 0.15) > 0
    assert enc.flops_per_token(128, 0.15) < enc.flops_per_token(128)
    assert electra > enc.flops_per_token(128) + ELECTRA(cfg, tokens).generator.flops_per_token(128, 0.15)


def test_truncation_trims_like_one_token_at_a_time():
    builder = SentencePairs(40, CLS, SEP, "nsp")
    rng = np.random.default_rng(0)
    fronts = []
    for _ in range(500):
        la, lb = (int(x) for x in rng.integers(1, 80, 2))
        a, b = np.arange(la), np.arange(1000, 1000 + lb)
        ta, tb = builder._truncate(a, b, rng)
        # reference: remove from the longer one (b on ties) until the pair fits
        ra, rb = la, lb
        while ra + rb > 37:
            if ra > rb:
                ra -= 1
            else:
                rb -= 1
        assert (len(ta), len(tb)) == (ra, rb)
        # what remains is a contiguous piece of each segment
        assert np.array_equal(ta, np.arange(ta[0], ta[0] + ra)) if ra else True
        if la - ra >= 10:
            fronts.append(int(ta[0]) / (la - ra))
    assert abs(np.mean(fronts) - 0.5) < 0.05  # each removal took the front half of the time


@pytest.mark.parametrize("name", [p.stem for p in sorted((CONF / "objective").glob("*.yaml"))])
def test_every_objective_keeps_the_plugin_contract(name):
    """Every conf/objective/ option: its builder makes examples, its collator (picklable, no
    weights) makes batches with the keys the training loop relies on, its forward gives a
    finite loss and detached metrics, it reports its FLOPs and maps its head for export (or declares
    that transformers has no class for it)."""
    import pickle

    from pretrainlab.model.encoder import flops_per_token
    from pretrainlab.objectives.base import BATCH_KEYS, Objective
    from pretrainlab.pretraining.assembly import build_objective
    from tests.conftest import random_documents

    tokens = SpecialTokens(500, 0, 1, 2, 3, 4, np.zeros(500, dtype=bool))
    config = EncoderConfig(vocab_size=500, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    objective = build_objective(compose_train(f"objective={name}"), config, tokens)
    assert isinstance(objective, Objective) and objective.name == name
    examples = list(objective.example_builder(32)(random_documents(40), np.random.default_rng(0)))
    assert examples and all(len(e["input_ids"]) <= 32 for e in examples)
    collator = pickle.loads(pickle.dumps(objective.collator()))
    batch = collator(examples[:8], torch.Generator().manual_seed(0))
    assert set(BATCH_KEYS) <= set(batch)
    assert batch["input_ids"].dtype == torch.int64 and batch["attention_mask"].shape == batch["input_ids"].shape
    assert int(batch["n_tokens"]) == int(batch["attention_mask"].sum())
    encoder = Encoder(config)
    out = objective(encoder, batch)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss) and out.loss.requires_grad
    assert out.metrics and all(not v.requires_grad and v.ndim == 0 for v in out.metrics.values())
    assert objective.flops_per_token(config, 32) > flops_per_token(config, 32, 0.15) > 0
    sequences = [np.array([2, 7, 8, 9, 3]), np.array([2, 7, 3]), np.array([2, 9, 8, 7, 3])]
    with torch.no_grad():  # the zero-shot score minimal pairs are compared by: one finite number per sequence
        scores = objective.eval().sentence_scores(encoder.eval(), sequences)
    objective.train(), encoder.train()
    assert scores.shape == (3,) and np.isfinite(scores).all() and (scores < 0).all()
    state = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    state |= {f"objective.{k}": v for k, v in objective.state_dict().items()}
    heads = [type(objective).hf_head(state, arch) for arch in ("bert", "albert", "electra")]
    # a head transformers has a class for is mapped to one; one it has none for says so and maps to none
    assert any(heads) == type(objective).hf_head_class, "hf_head and hf_head_class disagree"
    for head in filter(None, heads):
        assert head[0].endswith(("ForMaskedLM", "ForPreTraining")) and all(torch.is_tensor(t) for t in head[1].values())


@pytest.mark.parametrize(
    "name, schedule",
    [(p.stem, []) for p in sorted((CONF / "objective").glob("*.yaml"))]
    + [("roberta", ["objective.mask_rate_start=0.4"]), ("electra", ["objective.mask_rate_start=0.4"])],
)
def test_flops_per_token_is_what_a_count_of_the_step_finds(name, schedule):
    """Budgets compare objectives by flops_per_token: it must agree with torch's count of the matmul
    and attention FLOPs of a real training step (forward and backward) on full-length sequences
    (attention dropout on: the attention runs as counted matmuls on the CPU), within 3%; for an
    objective whose batches change over the run (a masking-rate schedule, CLM then MLM), at its start
    and its end (``flops_at``), and their mean over the run is what budgets plan with."""
    from torch.utils.flop_counter import FlopCounterMode

    from pretrainlab.pretraining.assembly import build_objective
    from tests.conftest import random_documents

    vocab = 2000
    tokens = SpecialTokens(vocab, 0, 1, 2, 3, 4, np.zeros(vocab, dtype=bool))
    config = EncoderConfig(
        vocab_size=vocab, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256, hidden_dropout=0.0
    )
    torch.manual_seed(0)
    # the hybrid's share is an expectation: at a quarter, a batch of 8 holds exactly 2 causal rows
    extra = ["objective.causal_share=0.25"] if name == "gpt_bert" else []
    objective = build_objective(compose_train(f"objective={name}", *extra, *schedule), config, tokens)
    examples = list(objective.example_builder(128)(random_documents(400, vocab=(5, vocab)), np.random.default_rng(0)))
    full = [e for e in examples if len(e["input_ids"]) == 128][:8]
    assert len(full) == 8
    encoder = Encoder(config)
    assert objective.scheduled == bool(schedule or name == "clm_mlm")
    for progress in (0.0, 1.0) if objective.scheduled else (None,):
        # a schedule's fixed-length batches keep the slots of its peak rate (CUDA graphs' static
        # shapes): the FLOPs counted are the rate's, which padded-to-fit batches compute
        collate = objective.collator(128 if progress is None else None)
        batch = (collate if progress is None else collate.at(progress))(full, torch.Generator().manual_seed(0))
        with FlopCounterMode(display=False) as counter:
            objective(encoder, batch).loss.backward()
        expected = (
            objective.flops_per_token(config, 128) if progress is None else objective.flops_at(config, 128, progress)
        )
        ratio = counter.get_total_flops() / int(batch["n_tokens"]) / expected
        assert 0.97 < ratio < 1.03, (progress, ratio)
    if objective.scheduled:  # both schedules here are linear, or two halves: the mean of the ends
        ends = (objective.flops_at(config, 128, 0.0) + objective.flops_at(config, 128, 1.0)) / 2
        assert objective.mean_flops_per_token(config, 128) == pytest.approx(ends, rel=2e-3)
        assert objective.flops_at(config, 128, 0.0) != objective.flops_at(config, 128, 1.0)


def test_causal_lm_predicts_each_next_token_from_its_prefix_alone():
    """Labels are the next real token (none after the last one or in padding), and a position's
    prediction does not move when any later token changes."""
    from pretrainlab.model.heads import IGNORE
    from pretrainlab.objectives.clm import CausalLM, next_tokens

    ids = torch.tensor([[2, 10, 11, 12, 3, 0], [2, 20, 3, 0, 0, 0]])
    real = ids != 0
    assert next_tokens(ids, real).tolist() == [
        [10, 11, 12, 3, IGNORE, IGNORE],
        [20, 3, IGNORE, IGNORE, IGNORE, IGNORE],
    ]
    tokens = SpecialTokens(100, 0, 1, 2, 3, 4, np.zeros(100, dtype=bool))
    config = EncoderConfig(vocab_size=100, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    encoder, objective = Encoder(config).eval(), CausalLM(config, tokens).eval()
    x = torch.randint(5, 100, (4, 12))
    batch = {"input_ids": x, "attention_mask": torch.ones_like(x, dtype=torch.bool)}
    with torch.no_grad():
        before = objective.encode(encoder, batch)
        later = x.clone()
        later[:, 7:] = (later[:, 7:] + 13) % 95 + 5
        after = objective.encode(encoder, {**batch, "input_ids": later})
    torch.testing.assert_close(after[:, :7], before[:, :7])
    assert not torch.allclose(after[:, 7:], before[:, 7:], atol=1e-4)


def test_the_hybrid_attends_causally_in_its_causal_rows_and_both_ways_in_its_masked_rows():
    from pretrainlab.objectives.gpt_bert import GPTBERT

    tokens = SpecialTokens(100, 0, 1, 2, 3, 4, np.zeros(100, dtype=bool))
    config = EncoderConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    encoder, objective = Encoder(config).eval(), GPTBERT(config, tokens).eval()
    x = torch.randint(5, 100, (4, 10))
    batch = {"input_ids": x, "attention_mask": torch.ones_like(x, dtype=torch.bool)}
    batch["causal"] = torch.tensor([True, False, True, False])
    later = x.clone()
    later[:, 6:] = (later[:, 6:] + 17) % 95 + 5
    with torch.no_grad():
        before, after = objective.hidden(encoder, batch), objective.hidden(encoder, {**batch, "input_ids": later})
    torch.testing.assert_close(after[[0, 2], :6], before[[0, 2], :6])  # causal rows: nothing later seen
    assert not torch.allclose(after[[1, 3], :6], before[[1, 3], :6], atol=1e-4)  # masked rows see it
    with pytest.raises(ValueError, match="causal_share must be in"):
        GPTBERT(config, tokens, causal_share=1.0)


def test_span_lengths_follow_spanberts_clipped_geometric_law():
    """SpanBERT's law, from its definition: p(n) = 0.2 x 0.8^(n-1) for n = 1..10 words, renormalised
    (mean 3.8 words), over 2,000 rows of ~512 tokens masked at 15%, as SpanBERT pretrains. The first
    five spans of each row are counted: a row holds more spans when its spans are short, so pooling
    every span of every row would over-count short ones (by 2 points at n = 1) whatever the law."""
    from pretrainlab.objectives.masking import geometric_probs

    law = np.array([0.2 * 0.8 ** (n - 1) for n in range(1, 11)])
    law /= law.sum()
    np.testing.assert_allclose(geometric_probs(0.2, 10), law, rtol=1e-12)
    assert abs((law * np.arange(1, 11)).sum() - 3.8) < 0.01  # the paper's mean
    rng = np.random.default_rng(0)
    counts = np.zeros(10)
    g = torch.Generator().manual_seed(0)
    for _ in range(2000):  # rows of 400 words of 1-3 pieces (as words_row), after [CLS]
        pieces = rng.choice(3, size=400, p=(0.8, 0.15, 0.05)) + 1
        ends = 1 + np.cumsum(pieces)
        starts = ends - pieces
        spans = ngram_spans(starts, ends, int(0.15 * pieces.sum()), 10, g, geometric_probs(0.2, 10))
        assert len(spans) > 5
        for _, n in spans[:5]:
            counts[n - 1] += 1
    observed = counts / counts.sum()
    assert np.all(np.abs(observed - law) < 0.015), observed.round(3)  # 0.015: over 3.5 sd at 10,000 spans
    assert abs((observed * np.arange(1, 11)).sum() - 3.8) < 0.08


def test_span_masking_corrupts_whole_spans_at_the_rate_and_finds_their_boundaries():
    """SpanBERT's collator over 2,000 rows of WordPiece-like ids: 15% of the eligible tokens predicted,
    no word split; every run of consecutive selected tokens shown as one (all [MASK], all random or
    all unchanged; 80/10/10 over the spans); each token's SBO inputs are the tokens just outside its
    run and its offset in it, as a direct walk along the row finds them."""
    from pretrainlab.model.heads import IGNORE
    from pretrainlab.objectives.spanbert import SpanMaskingCollator

    vocab = 5000
    continuation = np.zeros(vocab, dtype=bool)
    continuation[4000:] = True
    tokens = SpecialTokens(vocab, 0, 1, CLS, SEP, 4, continuation)
    rng = np.random.default_rng(0)
    rows = [np.array(words_row(rng, int(rng.integers(40, 100)))[0]) for _ in range(2000)]
    rows = [np.where(np.array(c) >= 500, c + 3500, c) for c in rows]  # ##pieces at 4000-4499
    examples = [{"input_ids": r.astype(np.int32)} for r in rows]
    collate = SpanMaskingCollator(tokens, MaskingConfig(0.15, 0.8, 0.1))
    kinds = {"mask": 0, "random": 0, "kept": 0}
    predicted = eligible = 0
    for start in range(0, 2000, 250):
        part = examples[start : start + 250]
        batch = collate(part, torch.Generator().manual_seed(start))
        positions, labels = batch["mlm_positions"], batch["mlm_labels"]
        for i, e in enumerate(part):
            ids = e["input_ids"].astype(np.int64)
            shown = batch["input_ids"][i].numpy()
            slots = labels[i] != IGNORE
            chosen = np.zeros(len(shown), dtype=bool)
            chosen[positions[i][slots].numpy()] = True
            predicted, eligible = predicted + chosen.sum(), eligible + len(ids) - 2
            starts, ends = word_spans(ids > 4, continuation[ids])
            assert all(chosen[a:b].all() or not chosen[a:b].any() for a, b in zip(starts, ends))
            # runs of chosen tokens, walked one position at a time
            p = 0
            while p < len(ids):
                if not chosen[p]:
                    p += 1
                    continue
                q = p
                while q < len(ids) and chosen[q]:
                    q += 1
                seen = shown[p:q]
                if (seen == 4).all():
                    kinds["mask"] += 1
                elif (seen == ids[p:q]).all():
                    kinds["kept"] += 1
                else:
                    assert not (seen == 4).any() and (seen != ids[p:q]).mean() > 0.9  # random, drawn per token
                    kinds["random"] += 1
                for k in range(p, q):
                    slot = int((positions[i] == k).nonzero()[0, 0])
                    assert batch["sbo_left"][i, slot] == p - 1 and batch["sbo_right"][i, slot] == q
                    assert batch["sbo_offset"][i, slot] == k - p
                p = q
            assert (batch["sbo_offset"][i][~slots] == -1).all()
    assert abs(predicted / eligible - 0.15) < 0.005, predicted / eligible
    spans = sum(kinds.values())
    assert spans > 6_000  # sd of the [MASK] share 0.005: within 0.02 is 4 sd
    assert abs(kinds["mask"] / spans - 0.8) < 0.02 and abs(kinds["random"] / spans - 0.1) < 0.015, kinds
