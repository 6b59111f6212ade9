"""Named entities (CoNLL-2003) as an evaluation: a token tagger (``tagging.TokenTagger``: a linear layer
on the encoder's state at each word's first sub-word) fine-tuned with the encoder, scored by entity
F1 as ``conlleval`` counts it (``conf/task/ner.yaml``). The data, its files and its metric are
``conll``; its trivial baseline (no entity found) scores an F1 of 0.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import torch

from pretrainlab.evaluation import conll
from pretrainlab.evaluation.base import FineTuned, RunContext
from pretrainlab.evaluation.finetuning import Fitting, Job
from pretrainlab.evaluation.tagging import TokenTagger, WordsDataset, collate_words, encode_words, label_set
from pretrainlab.runtime.signals import worker_init

log = logging.getLogger("pretrainlab")


class NerTask(FineTuned):
    """``task=ner``: CoNLL-2003 (``ner.data_dir``, the hub, or ``ner.source=synthetic``)."""

    data_block = "ner"
    rank = 20

    @property
    def display(self) -> str:
        return "NER"

    @property
    def metrics(self) -> tuple[str, ...]:
        return ("f1",)

    def data_files(self) -> list[Path] | None:
        root = conll.data_root(self.data)
        return None if root is None else list(conll.split_files(root).values())

    def evaluate(self, run: RunContext, model, fitting: Fitting) -> dict:
        t0 = time.time()
        splits, digests = conll.load(self.data)
        labels = label_set(splits["train"])
        label_ids = {label: i for i, label in enumerate(labels)}
        train = encode_words(splits["train"], model.tokenizer, model.tokens, self.max_seq_len, label_ids)
        dev = encode_words(splits["validation"], model.tokenizer, model.tokens, self.max_seq_len)
        gold = [tags for _, tags in splits["validation"]]
        log.info(
            "ner: %d train sentences (%d pieces), %d dev sentences (%d pieces), %d labels, loaded in %.1fs",
            len(splits["train"]),
            len(train),
            len(gold),
            len(dev),
            len(labels),
            time.time() - t0,
        )
        devices = fitting.devices
        pad = model.tokens.pad_id
        gen = torch.Generator().manual_seed(run.seed)
        multiple = 8 if devices.compile else 1
        train_loader = torch.utils.data.DataLoader(
            WordsDataset(train),
            batch_size=devices.micro_batch,
            shuffle=True,
            generator=gen,
            num_workers=run.num_workers,
            worker_init_fn=worker_init,
            collate_fn=functools.partial(collate_words, pad_id=pad, multiple=multiple),
        )
        # under DDP every rank's predictions are gathered: one width for all
        width = self.max_seq_len if devices.world > 1 else None
        dev_loader = torch.utils.data.DataLoader(
            WordsDataset(dev),
            batch_size=devices.micro_batch * 2,
            sampler=sorted(range(len(dev)), key=lambda i: len(dev.ids[i])),
            num_workers=run.num_workers,
            worker_init_fn=worker_init,
            collate_fn=functools.partial(collate_words, pad_id=pad, length=width, multiple=multiple),
        )
        steps_per_epoch, total = fitting.steps(len(train))
        module = TokenTagger(
            model.encoder, labels, fitting.optim, total, dev, gold, self.classifier_dropout, compile=devices.compile
        )
        return fitting.fit(
            Job(
                module,
                train_loader,
                [dev_loader],
                steps_per_epoch,
                {"validation": len(gold)},
                {
                    "train_examples": len(splits["train"]),
                    "labels": labels,
                    "no_skill": {"f1": 0.0},
                    "data": {"source": self.data.source, "files": digests},
                },
            )
        )


__all__ = ["NerTask"]
