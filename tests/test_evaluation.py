"""Evaluations beyond GLUE: zero-shot minimal pairs (BLiMP), named entities (CoNLL-2003) and
frozen-feature probes; their parity with reference computations, and that they are protected and
compared like GLUE's results."""

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pretrainlab.evaluation import conll as ner
from pretrainlab.evaluation.blimp import BlimpDataError, SyntheticPairs, breakdown, read_local
from pretrainlab.evaluation.data import DataBlock
from pretrainlab.model.encoder import Encoder, EncoderConfig
from pretrainlab.tokens import SpecialTokens
from tests.conftest import CONF, SMALL, compose_config, compose_train

EVAL = [
    "logger=csv",
    "trainer.enable_progress_bar=false",
    "blimp.source=synthetic",
    "blimp.synthetic.pairs=300",
    "ner.source=synthetic",
    "ner.synthetic.scale=0.3",
    "glue.source=synthetic",
    "glue.synthetic.scale=0.2",
]


# --- zero-shot scores: the objective's own likelihood, batched, equals the plain computation ------------
@pytest.mark.parametrize("name", [p.stem for p in sorted((CONF / "objective").glob("*.yaml"))])
def test_sentence_scores_equal_a_one_sentence_at_a_time_computation(name):
    """Masked LMs: the pseudo-log-likelihood, each token masked in turn and the full sequence run through
    the encoder with every logit computed, one copy at a time. XLNet: each token the one target of an order
    whose context is every other token, its masks built cell by cell. Causal LM: each token from its
    prefix, the prefix alone through the encoder. ELECTRA: the discriminator's log-probability
    that every token is original, one sentence at a time. The batched scores (copies of one length stacked,
    the last layer computing only the masked row) agree within float32 rounding."""
    from pretrainlab.objectives.clm import CausalLM
    from pretrainlab.objectives.masked_lm import MaskedLM
    from pretrainlab.objectives.xlnet import XLNet
    from pretrainlab.pretraining.assembly import build_objective

    vocab = 300
    tokens = SpecialTokens(vocab, 0, 1, 2, 3, 4, np.zeros(vocab, dtype=bool))
    config = EncoderConfig(vocab_size=vocab, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    encoder = Encoder(config).eval()
    objective = build_objective(compose_train(f"objective={name}"), config, tokens).eval()
    rng = np.random.default_rng(0)
    sequences = [
        np.array([tokens.cls_id, *rng.integers(5, vocab, int(rng.integers(1, 12))), tokens.sep_id]) for _ in range(60)
    ]
    fast = objective.sentence_scores(encoder, sequences, max_tokens=100)

    @torch.no_grad()
    def reference(seq: np.ndarray) -> float:
        ids = torch.as_tensor(seq)[None]
        if isinstance(objective, MaskedLM):
            total = 0.0
            for p in range(1, len(seq) - 1):
                masked = ids.clone()
                masked[0, p] = tokens.mask_id
                hidden = encoder(masked).hidden_states[0, p]
                logits = F.linear(
                    objective.mlm_head.transform(hidden),
                    encoder.embeddings.word_embeddings.weight,
                    objective.mlm_head.bias,
                )
                total += float(torch.log_softmax(logits.double(), -1)[int(seq[p])])
            return total
        if isinstance(objective, CausalLM):  # each token from the prefix before it, the prefix alone run
            return sum(
                float(
                    torch.log_softmax(
                        F.linear(
                            objective.lm_head.transform(encoder(ids[:, :p]).hidden_states[0, -1]),
                            encoder.embeddings.word_embeddings.weight,
                            objective.lm_head.bias,
                        ).double(),
                        -1,
                    )[int(seq[p])]
                )
                for p in range(1, len(seq) - 1)
            )
        if isinstance(objective, XLNet):  # each token the one target of an order: built from the definition
            total = 0.0
            for p in range(1, len(seq) - 1):
                n = len(seq)
                content = torch.tensor([[k != p or q == p for k in range(n)] for q in range(n)])
                hidden = encoder(
                    ids,
                    attention_mask=content[None],
                    queries=objective.query_stream(encoder, torch.tensor([[p]])),
                    query_mask=torch.tensor([[[k != p for k in range(n)]]]),
                ).queries[0, 0]
                logits = F.linear(
                    objective.lm_head.transform(hidden),
                    encoder.embeddings.word_embeddings.weight,
                    objective.lm_head.bias,
                )
                total += float(torch.log_softmax(logits.double(), -1)[int(seq[p])])
            return total
        logits = objective.discriminator_head(encoder(ids).hidden_states)[0, 1:-1].double()
        return float(torch.log(1 - torch.sigmoid(logits)).sum())

    np.testing.assert_allclose(fast, [reference(s) for s in sequences], rtol=1e-5, atol=2e-5)


def test_xlnet_scores_a_token_with_nothing_of_it_in_view():
    """The permutation LM's zero-shot score of a token must not see that token, not even through the
    content rows of the other positions (which, with every position seeing every other, would carry
    it to the query row from the second layer on): the distribution it gives at a position is the
    same whatever token stands there."""
    from pretrainlab.pretraining.assembly import build_objective

    vocab = 300
    tokens = SpecialTokens(vocab, 0, 1, 2, 3, 4, np.zeros(vocab, dtype=bool))
    config = EncoderConfig(vocab_size=vocab, hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    encoder = Encoder(config).eval()
    objective = build_objective(compose_train("objective=xlnet"), config, tokens).eval()
    ids = torch.randint(5, vocab, (6, 10))
    target = torch.tensor([1, 3, 5, 7, 8, 2])
    other = ids.clone()
    other[torch.arange(6), target] = (ids[torch.arange(6), target] + 50) % (vocab - 5) + 5
    with torch.no_grad():
        torch.testing.assert_close(
            objective.target_logits(encoder, other, target), objective.target_logits(encoder, ids, target)
        )
        # and it does see the others: a change elsewhere moves it
        elsewhere = ids.clone()
        elsewhere[torch.arange(6), (target + 1) % 10] += 1
        assert not torch.allclose(
            objective.target_logits(encoder, elsewhere, target), objective.target_logits(encoder, ids, target)
        )


# --- named entities: chunks and F1 as conlleval counts them -----------------------------------------------
def test_chunks_and_f1_follow_conlleval_on_hand_made_cases():
    # IOB1 (as released): an entity starts with I-; B- only after an entity of the same type
    assert ner.chunks(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC"]) == {
        ("PER", 0, 1),
        ("LOC", 3, 3),
        ("LOC", 4, 5),
    }
    # IOB2 (the hub's): the same spans
    assert ner.chunks(["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"]) == ner.chunks(
        ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC"]
    )
    assert ner.to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC"]) == [
        "B-PER",
        "I-PER",
        "O",
        "B-LOC",
        "B-LOC",
        "I-LOC",
    ]
    # a type change inside a run of I- tags starts a new chunk; an I- after O starts one (conlleval)
    assert ner.chunks(["I-PER", "I-ORG", "O", "I-MISC"]) == {("PER", 0, 0), ("ORG", 1, 1), ("MISC", 3, 3)}
    gold = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "I-ORG", "I-ORG"]]
    boundary = [["B-PER", "O", "O", "B-LOC", "O"], ["B-ORG", "I-ORG", "I-ORG"]]  # PER cut short: wrong
    s = ner.scores(gold, boundary)
    assert (s["correct"], s["guessed"], s["gold"]) == (2, 3, 3) and s["f1"] == pytest.approx(2 / 3)
    typed = [["B-PER", "I-PER", "O", "B-ORG", "O"], ["B-ORG", "I-ORG", "I-ORG"]]  # right span, wrong type
    s = ner.scores(gold, typed)
    assert (s["correct"], s["guessed"]) == (2, 3) and s["precision"] == pytest.approx(2 / 3)
    assert ner.scores(gold, [["O"] * 5, ["O"] * 3])["f1"] == 0.0


@pytest.mark.parametrize("scheme", ["iob1", "iob2"])
def test_entity_f1_agrees_with_seqeval_on_random_predictions(scheme):
    """An independent implementation (seqeval, whose default mode follows conlleval) gives the same
    F1 on random gold tags and predictions with boundary and type errors and ill-formed IOB."""
    from seqeval.metrics import f1_score

    rng = random.Random(0)
    types = ["PER", "LOC", "ORG"]

    def sentence(n: int) -> list[str]:
        tags, inside = [], None
        for _ in range(n):
            r = rng.random()
            if r < 0.5:
                tags.append("O")
                inside = None
            else:
                t = rng.choice(types) if inside is None or r < 0.6 else inside
                start = inside != t or r < 0.65
                prefix = "B" if start and (scheme == "iob2" or inside == t) else "I"
                tags.append(f"{prefix}-{t}")
                inside = t
        return tags

    gold = [sentence(rng.randint(1, 25)) for _ in range(300)]
    pred = [
        [t if rng.random() < 0.8 else rng.choice(["O", "B-PER", "I-PER", "I-LOC", "B-ORG"]) for t in g] for g in gold
    ]
    assert ner.scores(gold, pred)["f1"] == pytest.approx(f1_score(gold, pred), abs=1e-12)


def test_conll_files_are_read_with_the_release_quirks(tmp_path):
    train = (
        "-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\n\n"
        "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\n\nthe DT O O\nAtlanta NNP O B-MISC\n\n"
    )
    dev = "-DOCSTART- -X- -X- O\n\nBRUSSELS NNP I-NP I-LOC\n1996-08-22 CD I-NP O\n\n\n"
    (tmp_path / "train.txt").write_text(train)
    (tmp_path / "dev.txt").write_text(dev)
    splits = ner.read_local(tmp_path)
    assert [w for w, _ in splits["train"]] == [["EU", "rejects", "German"], ["Peter", "Blackburn"], ["the", "Atlanta"]]
    assert splits["train"][2][1] == ["O", "B-MISC"] and ner.chunks(splits["train"][2][1]) == {("MISC", 1, 1)}
    assert splits["validation"] == [(["BRUSSELS", "1996-08-22"], ["I-LOC", "O"])]  # the empty last block skipped
    (tmp_path / "dev.txt").write_text(dev.replace("1996-08-22 CD I-NP O", "1996-08-22"))
    with pytest.raises(ner.ConllDataError, match="dev.txt, line 4: 1 field.* other lines have 4"):
        ner.read_local(tmp_path)
    (tmp_path / "dev.txt").write_text(dev.replace("I-LOC", "LOC"))
    with pytest.raises(ner.ConllDataError, match=r"tag 'LOC' \(field 4 of 4\) is not O, B-<type> or I-<type>"):
        ner.read_local(tmp_path)
    (tmp_path / "dev.txt").unlink()
    with pytest.raises(FileNotFoundError, match="dev.txt or eng.testa"):
        ner.read_local(tmp_path)


def test_a_conll_file_without_its_entity_column_is_refused_not_read_from_another_column(tmp_path):
    """Lines of "word POS chunk" end in chunk tags (I-NP, I-VP), which look like entity tags: read from the
    last field they made entities of type NP and VP. The number of fields is checked against the format
    and against the file's other lines, and the column of the tags can be named."""
    train = "EU NNP I-NP\nrejects VBZ I-VP\nGerman JJ I-NP\n\nPeter NNP I-NP\nBlackburn NNP I-NP\n\n"
    dev = "BRUSSELS NNP I-NP\n1996-08-22 CD I-NP\n\n"
    (tmp_path / "train.txt").write_text(train)
    (tmp_path / "dev.txt").write_text(dev)
    for read in (lambda: ner.read_local(tmp_path), lambda: ner.load(DataBlock("ner", "local", str(tmp_path)))):
        with pytest.raises(ner.ConllDataError, match="lines have 3 fields.*chunk tags.*ner.tag_column=<n>"):
            read()
    chunks = ner.read_local(tmp_path, tag_column=3)  # said explicitly: the third column is what is read
    assert chunks["validation"] == [(["BRUSSELS", "1996-08-22"], ["I-NP", "I-NP"])]
    with pytest.raises(ner.ConllDataError, match="ner.tag_column=5, but its lines have 3 fields"):
        ner.read_local(tmp_path, tag_column=5)
    four = "EU NNP I-NP I-ORG\nrejects VBZ I-VP O\n\n"
    (tmp_path / "train.txt").write_text(four + "German JJ I-MISC\n\n")  # a training line short of a field
    (tmp_path / "dev.txt").write_text(four)
    assert [tags for _, tags in ner.read_local(tmp_path)["train"]] == [["I-ORG", "O"]]  # skipped, with a warning
    (tmp_path / "dev.txt").write_text(four + "German JJ I-MISC\n\n")
    with pytest.raises(ner.ConllDataError, match="dev.txt, line 4: 3 field.* other lines have 4 .*field 4"):
        ner.read_local(tmp_path)


def test_words_are_aligned_by_the_tokenizer_and_long_sentences_split_not_cut(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from pretrainlab.evaluation.tagging import assemble, encode_words, label_set

    vocab = {
        t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ab", "##cd", "x", "##y", "##z", "q"])
    }
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokens = SpecialTokens(len(vocab), 0, 1, 2, 3, 4, np.zeros(len(vocab), dtype=bool))
    words = ["abcd", "q", "xyz", "q", "abcd", "x"] * 3  # 2 + 1 + 3 + 1 + 2 + 1 = 10 pieces, three times
    tags = ["I-PER", "O", "I-LOC", "O", "I-PER", "I-PER"] * 3
    labels = label_set([(words, tags)])
    enc = encode_words([(words, tags)], tok, tokens, max_seq_len=10, label_ids={t: i for i, t in enumerate(labels)})
    assert len(enc) > 1 and all(len(ids) <= 10 for ids in enc.ids)  # split at word boundaries
    assert sum(len(f) for f in enc.firsts) == len(words)  # every word scored once
    for ids, first, lab in zip(enc.ids, enc.firsts, enc.labels):
        assert ids[0] == tokens.cls_id and ids[-1] == tokens.sep_id
        assert set(np.flatnonzero(lab != -100)) == set(first)  # a label at each word's first sub-word only
        assert all(ids[p] in (vocab["ab"], vocab["q"], vocab["x"]) for p in first)
    perfect = {i: np.asarray(lab).clip(0) for i, lab in enumerate(enc.labels)}
    assert assemble(enc, perfect, labels) == [ner.to_iob2(tags)]


# --- BLiMP data -------------------------------------------------------------------------------------------
def test_generated_minimal_pairs_are_distinct_and_read_back_as_the_reader_checks_them(tmp_path):
    """The generator draws pairs at random: one drawn twice is kept once (the reader refuses a
    repeated pair, which would count twice), at the size the quick study uses."""
    root = SyntheticPairs(pairs=1000).write(tmp_path / "cache")
    pairs = read_local(root)
    assert len(pairs) == 5000 and len({(p.paradigm, p.good, p.bad) for p in pairs}) == 5000


def test_blimp_files_are_read_completely_and_grouped(tmp_path):
    root = SyntheticPairs(pairs=20).write(tmp_path / "cache")
    pairs = read_local(root)
    assert len(pairs) == 100 and {p.paradigm for p in pairs} == {f.stem for f in root.glob("*.jsonl")}
    for p in pairs:  # same word count, different sentence: one point of grammar apart
        assert p.good != p.bad and len(p.good.split()) == len(p.bad.split())
    out = breakdown(pairs, np.array([i % 2 == 0 for i in range(len(pairs))]))
    assert out["field"]["morphology"]["pairs"] == 40 and out["paradigm"]["verb_object_order"]["accuracy"] == 0.5
    copy = tmp_path / "blimp"
    shutil.copytree(root, copy)
    row = json.loads((copy / "verb_as_argument.jsonl").read_text().splitlines()[0])
    (copy / "extra.jsonl").write_text(json.dumps({**row, "UID": "extra", "field": "syntax/semantics"}) + "\n")
    assert {p.field for p in read_local(copy) if p.paradigm == "extra"} == {"syntax_semantics"}
    (copy / "extra.jsonl").write_text(json.dumps({**row, "UID": "extra"}) + '\n{"sentence_good": "cut sh\n')
    with pytest.raises(BlimpDataError, match="extra.jsonl, line 2: not a JSON object"):
        read_local(copy)
    (copy / "extra.jsonl").write_text(json.dumps({k: v for k, v in row.items() if k != "field"}) + "\n")
    with pytest.raises(BlimpDataError, match="extra.jsonl, line 1: no field"):
        read_local(copy)


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"sentence_good": "", "sentence_bad": "Cats runs."}'], "line 1: sentence_good is '', not a sentence"),
        (['{"sentence_good": "Cats run.", "sentence_bad": "   "}'], "line 1: sentence_bad is '   ', not a sentence"),
        (['{"sentence_good": null, "sentence_bad": "Cats runs."}'], "line 1: sentence_good is None, not a sentence"),
        (["42"], "line 1: a JSON int, not an object"),
        (["row", "row"], "line 2: pairID 0 as line 1: a pair counted twice"),
        (["row", "same sentences, another id"], "line 2: the same two sentences as line 1"),
        ([], "extra.jsonl holds no pairs"),
    ],
)
def test_blimp_refuses_empty_missing_repeated_and_malformed_pairs_naming_file_and_line(tmp_path, lines, message):
    """An empty or missing sentence would be scored (``[CLS] [SEP]`` wins every pair; ``null`` became the word
    None), a repeated pair would count twice, an empty paradigm would vanish: each is refused with its place."""
    root = SyntheticPairs(pairs=5).write(tmp_path / "cache")
    copy = tmp_path / "blimp"
    shutil.copytree(root, copy)
    row = {**json.loads((copy / "verb_as_argument.jsonl").read_text().splitlines()[0]), "UID": "extra", "pairID": "0"}
    rendered = []
    for line in lines:
        if line == "row":
            rendered.append(json.dumps(row))
        elif line.startswith("same"):
            rendered.append(json.dumps({**row, "pairID": "1"}))
        else:
            rendered.append(line if line == "42" else json.dumps({**row, **json.loads(line)}))
    (copy / "extra.jsonl").write_text("".join(r + "\n" for r in rendered))
    with pytest.raises(BlimpDataError, match=re.escape(message)):
        read_local(copy)


def test_blimp_refuses_a_file_that_is_not_utf8_and_no_pairs_at_all(tmp_path):
    from pretrainlab.evaluation.blimp import load_pairs

    root = SyntheticPairs(pairs=5).write(tmp_path / "cache")
    copy = tmp_path / "blimp"
    shutil.copytree(root, copy)
    (copy / "extra.jsonl").write_bytes(b'{"sentence_good": "Caf\xe9 ..."}\n')
    with pytest.raises(BlimpDataError, match=r"extra.jsonl is not UTF-8: byte 0xe9 at offset \d+ \(line 1\)"):
        read_local(copy)
    with pytest.raises(BlimpDataError, match="blimp.max_pairs=0: null"):
        load_pairs(
            DataBlock("blimp", "local", str(root), options={"max_pairs": 0})
        )  # scored nothing: accuracy NaN, exit 0


# --- every evaluation on pretrained encoders ------------------------------------------------------------
@pytest.fixture
def encoders(shared_run) -> dict[str, Path]:
    """roberta and electra as the learning tests pretrain them (tests/test_learning.py: 300 and 1,000 steps
    on the synthetic corpus, each head past its baseline), made once per session and read-only."""
    from tests.test_learning import ELECTRA, train

    return {
        "roberta": train(shared_run, "roberta", 300)[0],
        "electra": train(shared_run, "electra", 1000, *ELECTRA)[0],
    }


def evaluate(pretrained, task: str, run_dir: Path, *overrides: str) -> dict:
    from pretrainlab.evaluation.run import run

    return run(compose_config("finetune", f"pretrained={pretrained}", f"task={task}", *EVAL, *overrides), run_dir)


@pytest.mark.slow
def test_pretrained_encoders_beat_scratch_on_minimal_pairs(encoders, tmp_path):
    """Each objective's own likelihood prefers the grammatical sentence far more often than the same
    architecture from scratch does (~ chance), significantly on the same pairs."""
    from pretrainlab.compare import item_outcomes
    from pretrainlab.uncertainty import item_difference

    for name, run_dir in encoders.items():
        result = evaluate(run_dir, "blimp", tmp_path / name)
        scratch = evaluate(run_dir, "blimp", tmp_path / f"{name}-scratch", "init=scratch")
        assert result["pairs"] == 1500 and set(result["breakdown"]["field"]) == {"morphology", "syntax", "semantics"}
        assert result["metrics"]["accuracy"] > 0.6 and abs(scratch["metrics"]["accuracy"] - 0.5) < 0.12, (
            name,
            result["metrics"],
            scratch["metrics"],
        )
        d = item_difference({0: item_outcomes(result)}, {0: item_outcomes(scratch)})
        assert d.mean > 10 and d.p < 1e-6
        assert result["data"]["files"] and result["sentences_per_s"] > 0
        again = evaluate(run_dir, "blimp", tmp_path / f"{name}-again")
        assert again["items"] == result["items"]  # deterministic


@pytest.mark.slow
def test_ner_fine_tuning_learns_the_synthetic_entities(encoders, tmp_path):
    result = evaluate(
        encoders["roberta"], "ner", tmp_path / "ner", "task.lr=1.0e-3", "task.epochs=4", "ner.synthetic.scale=0.5"
    )
    assert result["metrics"]["f1"] > 0.8, result["history"]
    assert result["labels"] == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
    assert result["eval_examples"] == {"validation": 200} and result["no_skill"] == {"f1": 0.0}
    assert 0 < result["detail"]["precision"] <= 1 and result["detail"]["gold"] > 0


def test_probes_score_every_layer_from_features_computed_once(encoders, tmp_path, monkeypatch):
    import pretrainlab.evaluation.probes as probes

    first = evaluate(encoders["roberta"], "probe_ner", tmp_path / "a")
    n_layers = compose_train(*SMALL).model.num_layers + 1
    assert list(first["probes"]) == [*(f"layer_{i}" for i in range(n_layers)), "last4", "mix"]
    assert first["metrics"]["f1"] == first["probes"]["last4"] > 0.3
    assert sum(first["mix_weights"]) == pytest.approx(1.0, abs=1e-3)
    monkeypatch.setattr(probes, "word_features", lambda *a, **k: pytest.fail("features computed again"))
    again = evaluate(encoders["roberta"], "probe_ner", tmp_path / "b")  # the cached features
    assert again["probes"] == first["probes"]
    other = evaluate(encoders["roberta"], "probe_ner", tmp_path / "c", "seed=1")
    assert other["probes"] != first["probes"] and abs(other["probes"]["last4"] - first["probes"]["last4"]) < 0.05
    sst2 = evaluate(encoders["roberta"], "probe_sst2", tmp_path / "d")
    assert sst2["metrics"]["accuracy"] == sst2["probes"]["last4"] > 0.6 and sst2["eval_examples"]["validation"] == 80


def test_probes_fitted_together_are_the_probes_fitted_one_by_one():
    """fit_probes fits every probe of probe_all in one step (stacked single-layer probes, one backward,
    one optimizer): each probe ends with the weights fit_probe gives it alone, weight decay and the
    scalar mix's faster group included, for the layers in order and for a gathered subset of them."""
    from pretrainlab.evaluation.probes import Probe, fit_probe, fit_probes

    torch.manual_seed(0)
    n, layers, hidden, classes = 1500, 5, 24, 4
    x = torch.randn(n, layers, hidden)
    y = (x[:, 3, :3].sum(1) > 0).long() + 2 * (x[:, 1, 0] > 1).long()

    def made(configs):
        out = {}
        for name, (ls, mix) in configs.items():
            torch.manual_seed(7)
            out[name] = Probe(ls, hidden, classes, mix)
        return out

    every = {f"layer_{i}": ([i], False) for i in range(layers)} | {
        "last4": ([1, 2, 3, 4], False),
        "mix": ([0, 1, 2, 3, 4], True),
    }
    subset = {"layer_4": ([4], False), "layer_1": ([1], False), "mix": ([1, 3], True)}
    for configs in (every, subset):
        alone = {k: fit_probe(p, x, y, 3, 1e-3, 64, 0.01, 7) for k, p in made(configs).items()}
        together = fit_probes(made(configs), x, y, 3, 1e-3, 64, 0.01, 7)
        assert list(together) == list(configs)
        for name in configs:
            for a, b in zip(alone[name].parameters(), together[name].parameters(), strict=True):
                assert torch.allclose(a, b, atol=1e-6), name
        fresh = made(configs)["layer_1"]
        assert not torch.allclose(fresh.linear.weight, together["layer_1"].linear.weight)  # it was trained


def test_an_export_with_another_tokenizer_is_refused_and_features_are_keyed_by_the_tokenizer(
    encoders, tmp_path, monkeypatch
):
    """The same weights read other ids with another tokenizer: an export whose tokenizer.json is not the
    one its config.json records is refused, and the probes' feature cache never serves features computed
    with another tokenizer (an export written before exports recorded it: not refused, not mistaken)."""
    import pretrainlab.evaluation.probes as probes
    from pretrainlab.data.corpus import SyntheticCorpus
    from pretrainlab.data.tokenizer import TokenizerSpec
    from pretrainlab.export.native import ExportError

    run_dir = tmp_path / "run"
    shutil.copytree(encoders["roberta"], run_dir)
    first = evaluate(run_dir, "probe_sst2", tmp_path / "a")
    sentences = [s for d in SyntheticCorpus(num_documents=100, seed=3).documents(tmp_path)["sentences"] for s in d]
    TokenizerSpec(vocab_size=300).train(sentences).save(str(run_dir / "encoder" / "tokenizer.json"))
    with pytest.raises(ExportError, match="tokenizer.json is not the tokenizer this encoder was trained with"):
        evaluate(run_dir, "probe_sst2", tmp_path / "b")
    config = run_dir / "encoder" / "config.json"
    meta = json.loads(config.read_text())
    config.write_text(json.dumps({k: v for k, v in meta.items() if k != "tokenizer_sha256"}))  # an older export
    computed = []
    original = probes.sentence_features
    monkeypatch.setattr(probes, "sentence_features", lambda *a, **k: computed.append(1) or original(*a, **k))
    other = evaluate(run_dir, "probe_sst2", tmp_path / "c")
    assert computed and other["probes"] != first["probes"]  # computed anew, with this tokenizer


def test_evaluation_results_are_protected_and_compared_like_glue(encoders, tmp_path):
    """The suite refuses a BLiMP result computed on files edited since; the comparison refuses one
    whose encoder was pretrained again; an unknown task is named with the ones there are."""
    from pretrainlab.compare import CompareError, collect
    from pretrainlab.evaluation.results import ResultError
    from pretrainlab.pretraining.run import run
    from pretrainlab.studies.suite import plan_suite, run_suite
    from tests.test_learning import LEARN

    run_dir = tmp_path / "run"
    shutil.copytree(encoders["roberta"], run_dir)
    data = tmp_path / "blimp"
    shutil.copytree(SyntheticPairs(pairs=50).write(tmp_path / "cache"), data)
    cfg = compose_config("suite", f"pretrained={run_dir}", *EVAL, "blimp.source=local", f"blimp.data_dir={data}")
    results = run_suite(cfg, ["blimp", "probe_sst2"], [0, 1], None, {})
    assert [(r["task"], r["seed"]) for r in results] == [("blimp", 0), ("probe_sst2", 0), ("probe_sst2", 1)]
    assert (run_dir / "eval" / "blimp" / "seed0.json").is_file() and not (
        run_dir / "eval" / "blimp" / "seed1.json"
    ).exists()
    table = collect([str(run_dir)])
    assert {r["task"] for r in table} == {"blimp", "probe_sst2"}
    rows = (data / "verb_object_order.jsonl").read_text().splitlines()
    (data / "verb_object_order.jsonl").write_text("\n".join(rows[:-1]) + "\n")  # a pair removed in place
    with pytest.raises(ResultError, match="computed on other data: verb_object_order.jsonl changed"):
        plan_suite(cfg, ["blimp"], [0], None, {})
    # trained further, with the settings it was pretrained with (tests/test_learning.py)
    run(compose_train(*LEARN, "objective=roberta", "max_steps=320", "val_every=300", "ckpt_path=last"), run_dir)
    with pytest.raises(CompareError, match="eval/blimp/seed0.json holds results of another encoder"):
        collect([str(run_dir)])
    with pytest.raises(KeyError, match="unknown evaluation task 'blimpp'; the tasks are: blimp, cola"):
        plan_suite(cfg, ["blimpp"], [0], None, {})


@pytest.mark.slow
def test_ner_pipeline_matches_transformers_token_classification(encoders, tmp_path):
    """The same encoder, exported to transformers, trained by transformers' token-classification recipe
    (BertForTokenClassification, the first sub-word of each word labelled through the fast tokenizer's
    word_ids, AdamW with linear warmup and decay, gradient clipping at 1, the same data, batch, epochs and
    lr): its dev entity F1 is within noise of ours, over two seeds each."""
    import transformers

    from pretrainlab.evaluation.tagging import label_set
    from pretrainlab.export.hf import export_hf

    settings = ["task.lr=1.0e-3", "task.epochs=4", "ner.synthetic.scale=0.5"]
    ours = [
        evaluate(encoders["roberta"], "ner", tmp_path / f"ours{s}", *settings, f"seed={s}")["metrics"]["f1"]
        for s in (0, 1)
    ]
    splits, _ = ner.load(
        DataBlock("ner", "synthetic", cache_dir=os.environ["PRETRAINLAB_CACHE"], synthetic={"scale": 0.5})
    )
    labels = label_set(splits["train"])
    label_ids = {t: i for i, t in enumerate(labels)}
    hf_dir = export_hf(encoders["roberta"], tmp_path / "hf")
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(hf_dir / "tokenizer.json"), pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    )

    def features(sentences):
        enc = tokenizer([w for w, _ in sentences], is_split_into_words=True, truncation=True, max_length=128)
        out = []
        for i, (_, tags) in enumerate(sentences):
            tags2, previous, labelled = ner.to_iob2(tags), None, []
            for w in enc.word_ids(i):
                labelled.append(-100 if w is None or w == previous else label_ids[tags2[w]])
                previous = w
            out.append((enc["input_ids"][i], labelled, enc.word_ids(i)))
        return out

    def batches(items, size, gen=None):
        order = torch.randperm(len(items), generator=gen).tolist() if gen is not None else list(range(len(items)))
        for k in range(0, len(order), size):
            chunk = [items[i] for i in order[k : k + size]]
            width = max(len(ids) for ids, _, _ in chunk)
            ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x, _, _ in chunk])
            lab = torch.tensor([y + [-100] * (width - len(y)) for _, y, _ in chunk])
            yield ids, ids != tokenizer.pad_token_id, lab, [w for _, _, w in chunk]

    train, dev = features(splits["train"]), features(splits["validation"])
    theirs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = transformers.BertForTokenClassification.from_pretrained(
            hf_dir, num_labels=len(labels), local_files_only=True
        )  # the export
        epochs, batch = 4, 32
        steps = epochs * -(-len(train) // batch)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-6)
        schedule = transformers.get_linear_schedule_with_warmup(opt, int(0.1 * steps), steps)
        gen = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(epochs):
            for ids, mask, lab, _ in batches(train, batch, gen):
                loss = model(input_ids=ids, attention_mask=mask, labels=lab).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                schedule.step()
                opt.zero_grad()
        model.eval()
        predicted = []
        with torch.no_grad():
            for ids, mask, _, word_ids in batches(dev, 64):
                pred = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
                for row, wids in enumerate(word_ids):
                    tags, previous = [], None
                    for pos, w in enumerate(wids):
                        if w is not None and w != previous:
                            tags.append(labels[int(pred[row, pos])])
                        previous = w
                    predicted.append(tags)
        theirs.append(ner.scores([t for _, t in splits["validation"]], predicted)["f1"])
    assert min(theirs) > 0.8, theirs
    assert abs(np.mean(ours) - np.mean(theirs)) < 0.05, (ours, theirs)
