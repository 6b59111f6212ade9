"""Token classification: a linear tagger on the encoder's hidden state of the first sub-word of every
word (BERT, Devlin et al. 2019, Section 5.3), fine-tuned with the encoder.

Words are aligned to sub-words by the tokenizer itself (``encode_batch(..., is_pretokenized=True)``
and its ``word_ids``), not by re-tokenising by hand. A sentence longer than ``max_seq_len`` sub-words
is split into pieces that fit, at word boundaries, so every word is scored; the pieces' predictions
are put back together before the sentence's chunks are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from pretrainlab.evaluation.conll import Sentence, scores, to_iob2
from pretrainlab.evaluation.finetuning import Trainable
from pretrainlab.model.encoder import Encoder
from pretrainlab.model.heads import IGNORE
from pretrainlab.optim import OptimConfig
from pretrainlab.tokens import SpecialTokens


@dataclass
class EncodedWords:
    """Sentences as sub-word pieces that fit ``max_seq_len``: per piece its ids (``[CLS] ... [SEP]``),
    the position of each word's first sub-word, the labels of those words (IGNORE elsewhere), and
    which sentence and word it starts at."""

    ids: list[np.ndarray]
    firsts: list[np.ndarray]
    labels: list[np.ndarray]  # one per sub-word: the word's label at its first sub-word, IGNORE elsewhere
    sentence: np.ndarray  # the sentence each piece comes from
    offset: np.ndarray  # the index, in its sentence, of each piece's first word
    words: list[int]  # words per sentence

    def __len__(self) -> int:
        return len(self.ids)


def encode_words(
    sentences: list[Sentence],
    tokenizer: Tokenizer,
    tokens: SpecialTokens,
    max_seq_len: int,
    label_ids: dict[str, int] | None = None,
) -> EncodedWords:
    """Encode ``sentences`` (IOB2 labels from ``label_ids`` when given; a tag it lacks is IGNORE)."""
    budget = max_seq_len - 2
    encodings = tokenizer.encode_batch(
        [words for words, _ in sentences], is_pretokenized=True, add_special_tokens=False
    )
    ids, firsts, labels, sentence, offset = [], [], [], [], []
    for s, ((words, tags), e) in enumerate(zip(sentences, encodings)):
        tags2 = to_iob2(tags)
        pieces_of: list[list[int]] = [[] for _ in words]
        for piece, w in zip(e.ids, e.word_ids):
            if w is not None:
                pieces_of[w].append(piece)
        for w, pieces in enumerate(pieces_of):
            if not pieces:  # a word the tokenizer gives nothing for (e.g. a control character): [UNK]
                pieces.append(tokens.unk_id)
            if len(pieces) > budget:
                pieces_of[w] = pieces[:budget]
        start = 0
        while start < len(words):
            end, used = start, 0
            while end < len(words) and used + len(pieces_of[end]) <= budget:
                used += len(pieces_of[end])
                end += 1
            seq, first, lab = [tokens.cls_id], [], [IGNORE]
            for w in range(start, end):
                first.append(len(seq))
                seq += pieces_of[w]
                lab += [label_ids.get(tags2[w], IGNORE) if label_ids else IGNORE] + [IGNORE] * (len(pieces_of[w]) - 1)
            seq.append(tokens.sep_id)
            lab.append(IGNORE)
            ids.append(np.asarray(seq, dtype=np.int64))
            firsts.append(np.asarray(first, dtype=np.int64))
            labels.append(np.asarray(lab, dtype=np.int64))
            sentence.append(s)
            offset.append(start)
            start = end
    return EncodedWords(ids, firsts, labels, np.asarray(sentence), np.asarray(offset), [len(w) for w, _ in sentences])


def label_set(sentences: list[Sentence]) -> list[str]:
    """The IOB2 labels of the training sentences: O first, then B-/I- of each type, sorted."""
    types = sorted({t[2:] for _, tags in sentences for t in tags if t != "O"})
    return ["O"] + [f"{p}-{t}" for t in types for p in ("B", "I")]


def collate_words(items: list, pad_id: int, length: int | None = None, multiple: int = 1) -> dict[str, torch.Tensor]:
    """Pad pieces to the longest, rounded up to a ``multiple`` (or to ``length``): ids, attention
    mask, labels (IGNORE on padding), index."""
    n = length or -(-max(len(x[1]) for x in items) // multiple) * multiple
    ids = torch.full((len(items), n), pad_id, dtype=torch.long)
    labels = torch.full((len(items), n), IGNORE, dtype=torch.long)
    for row, (_, x, y) in enumerate(items):
        ids[row, : len(x)] = torch.from_numpy(x)
        labels[row, : len(y)] = torch.from_numpy(y)
    return {
        "input_ids": ids,
        "attention_mask": ids != pad_id,
        "labels": labels,
        "index": torch.as_tensor([x[0] for x in items], dtype=torch.long),
    }


class WordsDataset(torch.utils.data.Dataset):
    def __init__(self, encoded: EncodedWords):
        self.encoded = encoded

    def __len__(self) -> int:
        return len(self.encoded)

    def __getitem__(self, i: int):
        return i, self.encoded.ids[i], self.encoded.labels[i]


def assemble(encoded: EncodedWords, predicted: dict[int, np.ndarray], labels: list[str]) -> list[list[str]]:
    """Each sentence's predicted tags from its pieces' predictions (label ids at every sub-word)."""
    out = [["O"] * n for n in encoded.words]
    for i, pred in predicted.items():
        s, start = int(encoded.sentence[i]), int(encoded.offset[i])
        for k, pos in enumerate(encoded.firsts[i]):
            out[s][start + k] = labels[int(pred[pos])]
    return out


class TokenTagger(Trainable):
    """The encoder + dropout + a linear layer per sub-word; trained with cross-entropy on the first
    sub-word of each word, scored by entity F1 on the dev sentences (``gold``) after every epoch."""

    def __init__(
        self,
        encoder: Encoder,
        labels: list[str],
        optim: OptimConfig,
        total_steps: int,
        dev: EncodedWords,
        gold: list[list[str]],
        classifier_dropout: float = 0.1,
        compile: dict | None = None,
    ):
        super().__init__(encoder, optim, total_steps, compile)
        self.labels, self.dev, self.gold = labels, dev, gold
        self.dropout = nn.Dropout(classifier_dropout)
        self.classifier = nn.Linear(encoder.config.hidden_size, len(labels))
        nn.init.normal_(self.classifier.weight, std=encoder.config.initializer_range)
        nn.init.zeros_(self.classifier.bias)

    def logits(self, batch: dict) -> torch.Tensor:
        out = self.encoder(batch["input_ids"], None, batch["attention_mask"])
        return self.classifier(self.dropout(out.hidden_states)).float()

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._outputs.setdefault(0, []).append((batch["index"], self(batch).argmax(-1)))

    def evaluate(self, outputs: dict[int, list]) -> dict[str, float]:
        index = torch.cat([o[0] for o in outputs[0]])
        width = max(o[1].shape[1] for o in outputs[0])
        pred = torch.cat([F.pad(o[1], (0, width - o[1].shape[1])) for o in outputs[0]])
        if self.trainer.world_size > 1:  # every rank scores the whole dev set
            index, pred = self.gather_padded(index, pred)
        predicted = {int(i): p for i, p in zip(index.cpu().numpy(), pred.cpu().numpy())}
        s = scores(self.gold, assemble(self.dev, predicted, self.labels))
        self.detail = s  # precision, recall and the chunk counts of the last evaluation
        self.log("val/precision", s["precision"], rank_zero_only=True)
        self.log("val/recall", s["recall"], rank_zero_only=True)
        return {"f1": s["f1"]}


__all__ = ["EncodedWords", "TokenTagger", "WordsDataset", "assemble", "collate_words", "encode_words", "label_set"]
