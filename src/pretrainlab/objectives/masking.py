"""Pure tensor functions for masked-LM corruption. No global RNG: every call takes a generator.

select_tokens       choose ~rate of the eligible tokens of each row (unbiased, exact per row)
select_ngrams       spans of whole words with a length law: ALBERT's p(n) proportional to 1/n, SpanBERT's
                    clipped geometric
corrupt             80% [MASK] / 10% random token / 10% unchanged (rates configurable), per token
corrupt_spans       the same choice made once per span of consecutive selected tokens (SpanBERT)
span_boundaries     each selected token's span: the unselected tokens either side, its offset in it
slot_layout         the selected positions of each row, as (batch, slots) with their labels
max_selected        the most tokens a row of a given width can have selected (a fixed slot count)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from pretrainlab.model.heads import IGNORE  # the label of an empty slot


@dataclass(frozen=True)
class MaskingConfig:
    """How many tokens to predict, whether whole words are chosen, and what the model sees in their
    place. ``whole_word``: every piece of a chosen word is predicted (WordPiece's ``##`` pieces, a
    byte-level BPE's pieces without a leading space): words are chosen until the rate's tokens are
    covered, as ``select_ngrams`` with n-grams of one word.

    ``rate_start``: the rate at the start of training, moving linearly to ``rate`` at its end (a
    masking-rate schedule, Ankner et al., 2024: 0.3 -> 0.15); None keeps ``rate`` throughout.
    ``at(progress)`` is the constant config at a point of the run (0 to 1)."""

    rate: float = 0.15
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1
    whole_word: bool = False
    rate_start: float | None = None

    def __post_init__(self) -> None:
        for name, rate in (("mask_rate", self.rate), ("mask_rate_start", self.rate_start)):
            if rate is not None and not 0.0 < rate < 1.0:
                raise ValueError(f"objective.{name} must be in (0, 1), got {rate}.")
        if (
            self.mask_token_prob < 0
            or self.random_token_prob < 0
            or self.mask_token_prob + self.random_token_prob > 1.0
        ):
            raise ValueError(
                f"objective.mask_token_prob ({self.mask_token_prob}) + objective.random_token_prob "
                f"({self.random_token_prob}) must be non-negative and sum to at most 1; the rest stays unchanged."
            )

    @property
    def scheduled(self) -> bool:
        """Whether the rate moves over the run."""
        return self.rate_start is not None and self.rate_start != self.rate

    @property
    def peak_rate(self) -> float:
        """The highest rate of the run (what a fixed number of slots must hold)."""
        return max(self.rate, self.rate_start if self.rate_start is not None else self.rate)

    def at(self, progress: float) -> MaskingConfig:
        """The constant masking at ``progress`` (0: the start of the run, 1: its end)."""
        if not self.scheduled:
            return self
        assert self.rate_start is not None
        p = min(1.0, max(0.0, progress))
        return replace(self, rate=self.rate_start + (self.rate - self.rate_start) * p, rate_start=None)


def _mask_counts(eligible: torch.Tensor, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Per-row number of tokens to select: rate * n, stochastically rounded so the mean is exact."""
    n = eligible.sum(dim=1).to(torch.float64)
    u = torch.rand(n.shape, generator=generator, dtype=torch.float64)
    k = torch.floor(n * rate + u).to(torch.long)
    return torch.minimum(k, n.to(torch.long))


def select_tokens(eligible: torch.Tensor, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Bool (batch, seq): a uniformly random subset of the eligible positions of each row.

    The number selected per row is rate x (eligible count), rounded stochastically, so the masked
    fraction is exact in expectation and has far less variance than independent coin flips.
    """
    scores = torch.rand(eligible.shape, generator=generator)
    scores = scores.masked_fill(~eligible, 2.0)  # ineligible positions sort last
    ranks = scores.argsort(dim=1).argsort(dim=1)
    return ranks < _mask_counts(eligible, rate, generator)[:, None]


def ngram_probs(max_n: int) -> np.ndarray:
    """ALBERT's span-length law: p(n) proportional to 1/n for n = 1..max_n."""
    p = 1.0 / np.arange(1, max_n + 1)
    return p / p.sum()


def geometric_probs(p: float, max_n: int) -> np.ndarray:
    """SpanBERT's span-length law: Geo(p) over n = 1..max_n words, renormalised (p = 0.2, max_n = 10:
    mean 3.8 words)."""
    w = p * (1.0 - p) ** np.arange(max_n)
    return w / w.sum()


def word_spans(eligible_row: np.ndarray, continuation_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token ranges [start, end) of the words of one row: a first piece plus its continuation pieces."""
    cont = continuation_row & eligible_row
    starts = np.flatnonzero(eligible_row & ~cont)
    if len(starts) == 0:
        return starts, starts
    # a word runs until the next token that is not one of its continuation pieces
    breaks = np.flatnonzero(~cont)
    nxt = np.searchsorted(breaks, starts, side="right")
    ends = np.where(nxt < len(breaks), breaks[np.minimum(nxt, len(breaks) - 1)], len(eligible_row))
    return starts, ends


def ngram_spans(
    starts: np.ndarray,
    ends: np.ndarray,
    to_mask: int,
    max_n: int,
    generator: torch.Generator,
    probs: np.ndarray | None = None,
) -> list[tuple[int, int]]:
    """N-gram spans over the words of one row, as (first word, number of words).

    Each span's length n is drawn from ``probs`` (p(n) for n = 1..max_n; default ALBERT's
    ``ngram_probs(max_n)``, p(n) proportional to 1/n) and placed at the next free start
    in a random order of words; a start where n words would overlap an earlier span, run past the
    row or join words that are not adjacent is passed over for this n. Where n words would exceed
    ``to_mask`` (the tokens still to mask), the next shorter n is used. Stops when ``to_mask`` are covered.
    """
    n_words = len(starts)
    if n_words == 0 or to_mask <= 0:
        return []
    law = torch.as_tensor(ngram_probs(max_n) if probs is None else probs, dtype=torch.float64)
    order = torch.randperm(n_words, generator=generator).tolist()
    draws = (torch.multinomial(law, n_words, replacement=True, generator=generator) + 1).tolist()
    adjacent = np.append(ends[:-1] == starts[1:], False)  # word w is followed directly by word w+1
    taken = np.zeros(n_words, dtype=bool)
    spans, covered, d = [], 0, 0
    for w in order:
        if covered >= to_mask or d >= len(draws):
            break
        if taken[w]:
            continue
        n = draws[d]
        # longest run of free, adjacent words from w (at most n)
        run = 1
        while run < n and w + run < n_words and adjacent[w + run - 1] and not taken[w + run]:
            run += 1
        if run < n:
            continue  # this start cannot host n words; keep n for the next start
        while n > 0 and covered + int(ends[w + n - 1] - starts[w]) > to_mask:
            n -= 1  # too few left to mask: a shorter n-gram
        d += 1
        if n == 0:
            continue
        taken[w : w + n] = True
        covered += int(ends[w + n - 1] - starts[w])
        spans.append((w, n))
    return spans


def select_ngrams(
    eligible: torch.Tensor,
    continuation: torch.Tensor,
    rate: float,
    max_n: int,
    generator: torch.Generator,
    probs: np.ndarray | None = None,
) -> torch.Tensor:
    """Bool (batch, seq): n-gram masking of whole words, ~rate of the eligible tokens, span lengths
    drawn from ``probs`` (default ALBERT's, p(n) proportional to 1/n, n <= max_n).

    ``continuation`` marks pieces inside a word (WordPiece ``##``): a span never splits a word.
    """
    counts_to_mask = _mask_counts(eligible, rate, generator).tolist()
    elig = eligible.cpu().numpy()
    cont = continuation.cpu().numpy()
    out = np.zeros_like(elig)
    for row, to_mask in enumerate(counts_to_mask):
        starts, ends = word_spans(elig[row], cont[row])
        for w, n in ngram_spans(starts, ends, to_mask, max_n, generator, probs):
            out[row, starts[w] : ends[w + n - 1]] = True
    return torch.from_numpy(out)


def max_selected(width: int, rate: float) -> int:
    """The most positions ``select_tokens`` or ``select_ngrams`` can select in a row of ``width``
    tokens: each selects at most floor(n x rate + u) of n <= width eligible tokens, u < 1."""
    return int(width * rate) + 1


def slot_layout(
    selected: torch.Tensor, labels: torch.Tensor, slots: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, labels), each (batch, slots): row i's selected positions in increasing order,
    then empty slots at position 0 with label ``IGNORE``. ``slots``: a fixed count (static shapes),
    else the most any row has."""
    counts = selected.sum(1)
    most = int(counts.max()) if selected.numel() else 0
    if slots is None:
        slots = most
    elif most > slots:
        raise ValueError(f"{most} positions selected in a row, more than its {slots} slots")
    # a stable sort of "not selected" puts each row's selected positions first, in order
    order = torch.argsort((~selected).to(torch.int8), dim=1, stable=True)[:, :slots]
    filled = torch.arange(slots)[None, :] < counts[:, None]
    positions = torch.where(filled, order, 0)
    return positions, torch.where(filled, labels.gather(1, positions), IGNORE)


def corrupt(
    input_ids: torch.Tensor,
    selected: torch.Tensor,
    masking: MaskingConfig,
    mask_id: int,
    random_candidates: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """A corrupted copy of ``input_ids``: each selected token independently becomes [MASK] with
    ``mask_token_prob``, a random non-special token with ``random_token_prob``, else stays."""
    u = torch.rand(input_ids.shape, generator=generator)
    return _replace(input_ids, selected, u, masking, mask_id, random_candidates, generator)


def corrupt_spans(
    input_ids: torch.Tensor,
    selected: torch.Tensor,
    masking: MaskingConfig,
    mask_id: int,
    random_candidates: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    """As ``corrupt``, with one choice per span of consecutive selected tokens (SpanBERT): a span is
    all [MASK] with ``mask_token_prob``, all random tokens (each drawn on its own) with
    ``random_token_prob``, else unchanged."""
    u = torch.rand(input_ids.shape, generator=generator)
    positions = torch.arange(input_ids.shape[1])[None, :].expand_as(input_ids)
    before = torch.zeros_like(selected)
    before[:, 1:] = selected[:, :-1]
    start = torch.where(selected & ~before, positions, -1).cummax(dim=1).values  # each token's span start
    u = u.gather(1, start.clamp(min=0))
    return _replace(input_ids, selected, u, masking, mask_id, random_candidates, generator)


def _replace(
    input_ids: torch.Tensor,
    selected: torch.Tensor,
    u: torch.Tensor,
    masking: MaskingConfig,
    mask_id: int,
    random_candidates: torch.Tensor,
    generator: torch.Generator,
) -> torch.Tensor:
    to_mask = selected & (u < masking.mask_token_prob)
    to_random = selected & (u >= masking.mask_token_prob) & (u < masking.mask_token_prob + masking.random_token_prob)
    out = input_ids.masked_fill(to_mask, mask_id)
    picks = torch.randint(len(random_candidates), input_ids.shape, generator=generator)
    return torch.where(to_random, random_candidates[picks], out)


def span_boundaries(selected: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(left, right, offset), each shaped as ``positions`` ((batch, slots) selected positions): the
    last unselected position before each one, the first unselected one after it, and its offset in
    the run of consecutive selected tokens between them (0 for the first). Adjacent spans are one
    span here, as SpanBERT merges them. A row's last position counts as unselected past its end."""
    b, t = selected.shape
    index = torch.arange(t)[None, :].expand(b, t)
    last_unselected = torch.where(selected, -1, index).cummax(dim=1).values
    next_unselected = torch.where(selected, t, index).flip(1).cummin(dim=1).values.flip(1)
    left = last_unselected.gather(1, positions).clamp(min=0)
    right = next_unselected.gather(1, positions).clamp(max=t - 1)
    return left, right, positions - left - 1
