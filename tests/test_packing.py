import numpy as np
import pytest

from pretrainlab.data.packing import PackedBlocks
from tests.conftest import random_documents

CLS, SEP = 2, 3


@pytest.mark.parametrize("max_len", [16, 64, 128])
def test_packing_keeps_every_token_once_and_marks_boundaries(max_len):
    docs = random_documents(200, seed=max_len)
    blocks = list(PackedBlocks(max_len, CLS, SEP)(docs))
    assert all(len(b["input_ids"]) <= max_len for b in blocks)
    assert all(b["input_ids"][0] == CLS and b["input_ids"][-1] == SEP for b in blocks)
    # the blocks' bodies, with document separators, reproduce the corpus exactly
    body = np.concatenate([b["input_ids"][1:-1] for b in blocks])
    expected = np.concatenate([s for d in docs for s in d])
    assert np.array_equal(body[body != SEP], expected)
    # a separator inside a block sits exactly at a document boundary
    boundaries = set(np.cumsum([sum(len(s) for s in d) for d in docs])[:-1].tolist())
    seen = 0
    for b in blocks:
        for tok in b["input_ids"][1:-1]:
            if tok == SEP:
                assert seen in boundaries
            else:
                seen += 1
    # blocks are well filled: packing wastes little
    assert np.mean([len(b["input_ids"]) for b in blocks]) > 0.7 * max_len


def test_whole_sentences_are_not_split_unless_longer_than_a_block():
    docs = [[np.arange(5, 15, dtype=np.int32), np.arange(20, 26, dtype=np.int32)], [np.arange(30, 70, dtype=np.int32)]]
    blocks = [b["input_ids"].tolist() for b in PackedBlocks(16, CLS, SEP)(docs)]
    assert blocks[0] == [CLS, *range(5, 15), SEP]  # 10 + 6 > 14: the second sentence moves on
    assert blocks[1][:8] == [CLS, *range(20, 26), SEP]  # then the document boundary
    assert sum(len(b) - 2 for b in blocks) == 10 + 6 + 40 + blocks[1].count(SEP) - 1


def test_doc_sentences_end_every_block_with_its_document():
    """RoBERTa's DOC-SENTENCES: no block holds two documents (so no boundary separator inside), the
    blocks of a document are its tokens in order, and only a document's last block is short."""
    docs = random_documents(200, seed=7)
    blocks = list(PackedBlocks(64, CLS, SEP, cross_documents=False)(docs))
    bodies = [b["input_ids"][1:-1] for b in blocks]
    assert all(len(b["input_ids"]) <= 64 and SEP not in body for b, body in zip(blocks, bodies))
    at = 0
    for doc in docs:
        tokens = np.concatenate(doc)
        mine = []
        while sum(len(x) for x in mine) < len(tokens):
            mine.append(bodies[at])
            at += 1
        assert np.array_equal(np.concatenate(mine), tokens)  # the document, whole, and nothing else
        # a block closes early only when its next sentence would not fit (or the document ends)
        assert all(len(x) > 62 - 30 for x in mine[:-1])
    assert at == len(bodies)
    packed = list(PackedBlocks(64, CLS, SEP)(docs))
    assert len(blocks) > len(packed)  # the price: short last blocks
