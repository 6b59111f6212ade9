"""What each pretraining head has learned, beside what it would score having learned nothing.

A head's loss going down says little on its own: a masked LM that has learned only token
frequencies scores the most frequent token's share at [MASK] positions, and its accuracy over all
selected tokens looks far better because a tenth of them are shown unchanged and copied. Every
objective therefore counts, on held-out batches, what its heads get right (``Objective.tally``) and
judges each against its trivial baseline (``Objective.learning``):

    masked LM (and ELECTRA's generator)   accuracy at [MASK] positions against the most frequent
                                          token of the same positions, and loss against the
                                          training text's token frequencies there (the unigram
                                          baseline); kept and randomly replaced positions apart
    replaced-token detection (ELECTRA)    recall, precision and AUC of "replaced" against always
                                          answering "original" (recall 0, AUC 0.5) and against a
                                          detector that sees each token alone, not its context
    sentence-pair heads (NSP, SOP)        accuracy against the majority label of the held-out pairs

Tallies are sums (counts, summed losses, histograms), so they add exactly over batches and ranks;
``add`` accumulates them and ``HeadCheck`` is the verdict on one head:

    at baseline      indistinguishable from its trivial baseline: a comparison of encoders whose
                     heads are all here measures nothing of their objectives yet
    above baseline   learning, but not yet clearly
    past baseline    clearly past it (masked LM: at least twice the unigram baseline's accuracy
                     and a lower loss than the token frequencies'; detection: AUC at least 0.75,
                     and 0.05 over the token alone's, with a tenth of the replacements found; pair
                     heads: 5 points over the majority label, significantly)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from pretrainlab.model.heads import IGNORE

KINDS = ("mask", "kept", "random")  # what the model was shown at a selected position
# 2: the unigram loss is that of the training text's token frequencies (1: the entropy of the held-out
# positions' own tokens, which is lower by half a nat at a few thousand positions of an 8k vocabulary);
# 3: replaced-token detection is judged beside the token alone as well (detection_check)
BASELINE_VERSION = 3
TOKEN_ALONE_SINCE = 3  # the version from which detection is judged beside the token alone
RECORDED_SINCE = 2  # a recorded evaluation (its weights gone: a slot's) is read from this version on
LOGIT_RANGE, LOGIT_BINS = 16.0, 2048  # the detection histogram: logits clamped to +-16 in 2048 bins
AT, ABOVE, PAST = "at baseline", "above baseline", "past baseline"

Tally = dict[str, torch.Tensor]


@dataclass(frozen=True)
class HeadCheck:
    """One head's held-out score beside its trivial baseline, and the verdict."""

    head: str  # "MLM at [MASK]"
    metric: str  # the metric's name in the run's logs: "mlm_acc_at_mask"
    value: float
    baseline: float
    baseline_name: str  # "most frequent token"
    status: str  # AT, ABOVE or PAST
    detail: str = ""  # further numbers worth reading beside it

    @property
    def at_baseline(self) -> bool:
        return self.status == AT

    def line(self) -> str:
        extra = f"; {self.detail}" if self.detail else ""
        return f"{self.head} {self.value:.3f} vs {self.baseline_name} {self.baseline:.3f}{extra}: {self.status}"

    def to_dict(self) -> dict:
        return asdict(self)


def add(total: Tally | None, tally: Tally) -> Tally:
    """``total`` + ``tally``, key by key (detached)."""
    if not total:
        return {k: v.detach().clone() for k, v in tally.items()}
    for k, v in tally.items():
        total[k] = total[k] + v.detach() if k in total else v.detach().clone()
    return total


def to_host(tally: Tally) -> dict[str, float | list[float]]:
    """A tally as plain numbers (scalars) and lists (histograms, counts), for JSON and ``learning``."""
    return {k: (float(v) if v.numel() == 1 else v.double().cpu().tolist()) for k, v in tally.items()}


# --- masked-LM heads ---------------------------------------------------------------------------------
def masked_tally(
    prefix: str,
    logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    labels: torch.Tensor,
    shown: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    chunk: int = 2048,
) -> Tally:
    """Counts of a masked-LM head at its selected positions, by what the model was shown there.

    hidden (batch, slots, d): the encoder's output at the selected positions; labels (batch, slots):
    the original ids (``IGNORE`` in empty slots); shown (batch, slots): the ids the model was given
    there ([MASK], the original kept, or a random token); ``logits``: hidden -> vocabulary logits.
    Rows are scored ``chunk`` at a time, so the vocabulary-sized logits of a large batch are never
    held at once."""
    scored = labels != IGNORE
    h, y, x = hidden[scored], labels[scored], shown[scored]
    kind = torch.where(x == mask_id, 0, torch.where(x == y, 1, 2))
    answers = torch.zeros(len(y), dtype=torch.long, device=y.device)
    nll = torch.zeros(len(y), dtype=torch.float64, device=y.device)
    for s in range(0, len(y), chunk):
        z = logits(h[s : s + chunk]).float()
        answers[s : s + chunk] = z.argmax(-1)
        nll[s : s + chunk] = F.cross_entropy(z, y[s : s + chunk], reduction="none").double()
    correct = answers == y
    out: Tally = {}
    for k, name in enumerate(KINDS):
        sel = kind == k
        out[f"{prefix}_n_{name}"] = sel.sum().double()
        out[f"{prefix}_correct_{name}"] = (correct & sel).sum().double()
        out[f"{prefix}_nll_{name}"] = nll[sel].sum()
    out[f"{prefix}_labels_at_mask"] = torch.bincount(y[kind == 0], minlength=vocab_size).double()
    # what it answers at [MASK]: one token everywhere is the unigram plateau (or a collapse)
    out[f"{prefix}_answers_at_mask"] = torch.bincount(answers[kind == 0], minlength=vocab_size).double()
    return out


def masked_metrics(prefix: str, tally: dict, token_counts=None) -> dict[str, float]:
    """Accuracy and loss at [MASK], kept and random positions; the unigram baseline at [MASK]: the
    accuracy of always answering the most frequent token there, and the loss there of predicting
    the training text's token frequencies (``token_counts``, add-one smoothed): what a model that
    has learned frequencies and nothing else scores. Without ``token_counts`` (a streamed corpus)
    the loss baseline is the entropy of the held-out tokens themselves, an optimistic one: with a
    few thousand positions it sits half a nat below what frequencies learned from training text
    score (docs/learning.md)."""
    out = {}
    for name in KINDS:
        n = tally[f"{prefix}_n_{name}"]
        out[f"{prefix}_acc_at_{name}"] = tally[f"{prefix}_correct_{name}"] / n if n else math.nan
        out[f"{prefix}_loss_at_{name}"] = tally[f"{prefix}_nll_{name}"] / n if n else math.nan
    counts = torch.as_tensor(tally[f"{prefix}_labels_at_mask"], dtype=torch.float64)
    n = float(counts.sum())
    p = counts[counts > 0] / n if n else counts
    out[f"{prefix}_unigram_acc"] = float(p.max()) if n else math.nan
    if token_counts is not None and n:
        q = torch.as_tensor(token_counts, dtype=torch.float64) + 1.0
        if len(q) != len(counts):
            raise ValueError(f"token_counts has {len(q)} tokens, the tally's vocabulary {len(counts)}")
        out[f"{prefix}_unigram_loss"] = float(-(counts * (q / q.sum()).log()).sum() / n)
    else:
        out[f"{prefix}_unigram_loss"] = float(-(p * p.log()).sum()) if n else math.nan
    out[f"{prefix}_n_at_mask"] = tally[f"{prefix}_n_mask"]
    answers = tally.get(f"{prefix}_answers_at_mask")
    if answers is not None:  # tallies recorded before the answers were counted have none
        answers = torch.as_tensor(answers, dtype=torch.float64)
        given = float(answers.sum())
        out[f"{prefix}_distinct_answers"] = float((answers > 0).sum())
        out[f"{prefix}_top_answer_share"] = float(answers.max()) / given if given else math.nan
    return out


def masked_check(head: str, prefix: str, m: dict[str, float], where: str = "[MASK]") -> HeadCheck:
    """``where``: what the scored positions are called in the verdict's detail ([MASK]; XLNet: its targets)."""
    value, base = m[f"{prefix}_acc_at_mask"], m[f"{prefix}_unigram_acc"]
    beats_frequencies = m[f"{prefix}_loss_at_mask"] < m[f"{prefix}_unigram_loss"]
    status = AT if value < 1.25 * base else PAST if value >= 2 * base and beats_frequencies else ABOVE
    shown = ", ".join(
        f"at {name} positions {m[f'{prefix}_acc_at_{name}']:.3f}"
        for name in KINDS[1:]
        if math.isfinite(m[f"{prefix}_acc_at_{name}"])
    )
    detail = f"loss at {where} {m[f'{prefix}_loss_at_mask']:.3f} vs unigram {m[f'{prefix}_unigram_loss']:.3f}" + (
        f"; accuracy {shown}" if shown else ""
    )
    if f"{prefix}_distinct_answers" in m:
        detail += (
            f"; {int(m[f'{prefix}_distinct_answers']):,} distinct answer(s) at {where} "
            f"(the commonest {m[f'{prefix}_top_answer_share']:.0%} of them)"
        )
    return HeadCheck(head, f"{prefix}_acc_at_mask", value, base, "most frequent token", status, detail)


# --- the encoder's final states ------------------------------------------------------------------------
# mean cosine of final states from which every token looks alike to the heads: a collapsed XLNet measured
# 0.99998 on the GPU (docs/learning.md), learning encoders 0.1-0.97 (ELECTRA's discriminator the highest)
COLLAPSED = 0.99


def states_tally(encoder: torch.nn.Module, batch: dict) -> Tally:
    """The encoder's final hidden states at the batch's real tokens, as fine-tuning computes them (every
    position attending every real one): the sum of their unit vectors and their count, from which
    :func:`states_metrics` gives their mean pairwise cosine. A collapsed encoder (Noci et al., 2022:
    rank collapse) gives every token nearly the same state, cosine near 1; an encoder on its unigram
    plateau still tells its tokens apart."""
    out = encoder(batch["input_ids"], batch.get("token_type_ids"), batch["attention_mask"])
    real = batch["attention_mask"].bool()
    unit = F.normalize(out.hidden_states[real].float(), dim=-1)
    return {"states_unit_sum": unit.sum(0).double(), "states_n": torch.tensor(float(len(unit)), device=unit.device)}


def states_metrics(tally: dict) -> dict[str, float]:
    """``hidden_cosine``: the mean cosine over distinct pairs of held-out tokens' final states,
    (|sum of unit vectors|^2 - n) / (n (n - 1))."""
    if "states_n" not in tally:
        return {}
    n = float(tally["states_n"])
    total = torch.as_tensor(tally["states_unit_sum"], dtype=torch.float64)
    return {"hidden_cosine": (float(total @ total) - n) / (n * (n - 1)) if n > 1 else math.nan}


def collapsed(metrics: dict[str, float]) -> bool:
    """Whether the final states of ``metrics`` (:func:`states_metrics`) say the encoder collapsed."""
    return metrics.get("hidden_cosine", 0.0) >= COLLAPSED


def states_line(metrics: dict[str, float]) -> str:
    """What the final states say, for a run's console summary and a study's learning.md."""
    cosine = metrics.get("hidden_cosine", math.nan)
    if not math.isfinite(cosine):
        return ""
    verdict = "collapsed: every token looks alike" if collapsed(metrics) else "tokens told apart"
    return f"final states' mean cosine {cosine:.2f} ({verdict})"


def held_out_tally(objective, encoder: torch.nn.Module, batch: dict) -> Tally:
    """One held-out batch's counts: the objective's heads (``Objective.tally``) and the encoder's final
    states (:func:`states_tally`)."""
    return objective.tally(encoder, batch) | states_tally(encoder, batch)


def judge(objective, tally: dict) -> tuple[dict[str, float], list[HeadCheck]]:
    """The metrics and verdicts of summed held-out tallies (:func:`held_out_tally`, :func:`to_host`):
    the objective's heads (``Objective.learning``) and the encoder's final states."""
    metrics, checks = objective.learning(tally)
    return metrics | states_metrics(tally), checks


# --- replaced-token detection ------------------------------------------------------------------------
TOKEN_HALVES = ("a", "b")  # the held-out tokens in two alternate halves: one fits, the other judges (token_alone_auc)


def detection_tally(
    prefix: str,
    logits: torch.Tensor,
    replaced: torch.Tensor,
    real: torch.Tensor,
    ids: torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> Tally:
    """Counts of a detector whose ``logits`` say "replaced" (> 0) for the tokens where ``real``, with the
    truth in ``replaced``; histograms of the logits of replaced and original tokens for the AUC. With the
    detector's input ``ids`` (and ``vocab_size``), also how often each token was replaced and kept, in two
    halves of the tokens (alternate ones): what a detector that sees the token alone, not its context,
    could know (:func:`token_alone_auc`)."""
    real = real.bool()
    z, t = logits.float()[real], replaced.bool()[real]
    pred = z > 0
    clamped = z.clamp(-LOGIT_RANGE, LOGIT_RANGE)
    hist = lambda v: torch.histc(v, bins=LOGIT_BINS, min=-LOGIT_RANGE, max=LOGIT_RANGE).double()  # noqa: E731
    counts = {
        f"{prefix}_n": torch.tensor(float(len(t)), dtype=torch.float64, device=z.device),
        f"{prefix}_n_replaced": t.sum().double(),
        f"{prefix}_tp": (pred & t).sum().double(),
        f"{prefix}_fp": (pred & ~t).sum().double(),
        f"{prefix}_nll": F.binary_cross_entropy_with_logits(z, t.float(), reduction="sum").double(),
        f"{prefix}_hist_replaced": hist(clamped[t]),
        f"{prefix}_hist_original": hist(clamped[~t]),
    }
    if ids is not None and vocab_size is not None:
        tokens = ids[real]
        half = torch.arange(len(tokens), device=tokens.device) % 2
        for h, name in enumerate(TOKEN_HALVES):
            for kind, chosen in (("replaced", t), ("original", ~t)):
                picked = tokens[chosen & (half == h)]
                counts[f"{prefix}_token_{kind}_{name}"] = torch.bincount(picked, minlength=vocab_size).double()
    return counts


def token_alone_auc(prefix: str, tally: dict) -> float:
    """The AUC of the best detector that sees each token alone: every token scored by how often it was
    replaced in one half of the held-out tokens (shrunk towards the half's replaced share by one token's
    worth), and judged on the other half, both ways round (cross-fitted, so that a token seen once does
    not score itself). Replacements a detector can tell from the token alone (rare or out-of-place words a
    generator sampling at a high temperature puts in) score high here; a discriminator that reads the
    context must do better than this. NaN without the per-token counts."""
    keys = [f"{prefix}_token_{kind}_{h}" for h in TOKEN_HALVES for kind in ("replaced", "original")]
    if not all(k in tally for k in keys):
        return math.nan
    rep_a, orig_a, rep_b, orig_b = (torch.as_tensor(tally[k], dtype=torch.float64) for k in keys)
    aucs = []
    for fit_rep, fit_orig, rep, orig in ((rep_a, orig_a, rep_b, orig_b), (rep_b, orig_b, rep_a, orig_a)):
        seen = fit_rep.sum() + fit_orig.sum()
        if not seen or not rep.sum() or not orig.sum():
            continue
        share = fit_rep.sum() / seen
        score = (fit_rep + share) / (fit_rep + fit_orig + 1.0)
        order = torch.argsort(score)
        groups = torch.unique_consecutive(score[order], return_inverse=True)[1]  # tokens of one score tie
        pos = torch.zeros(int(groups.max()) + 1, dtype=torch.float64).index_add_(0, groups, rep[order])
        neg = torch.zeros_like(pos).index_add_(0, groups, orig[order])
        aucs.append(auc_from_histograms(pos, neg))
    return sum(aucs) / len(aucs) if aucs else math.nan


def auc_from_histograms(positive, negative) -> float:
    """P(a positive scores above a negative), ties (the same bin) counted half."""
    pos, neg = torch.as_tensor(positive, dtype=torch.float64), torch.as_tensor(negative, dtype=torch.float64)
    n_pos, n_neg = float(pos.sum()), float(neg.sum())
    if not n_pos or not n_neg:
        return math.nan
    below = torch.cumsum(neg, 0) - neg  # negatives in lower bins
    return float((pos * (below + 0.5 * neg)).sum()) / (n_pos * n_neg)


def detection_metrics(prefix: str, tally: dict) -> dict[str, float]:
    n, n_rep, tp, fp = (tally[f"{prefix}_{k}"] for k in ("n", "n_replaced", "tp", "fp"))
    rate = n_rep / n if n else math.nan
    return {
        f"{prefix}_recall": tp / n_rep if n_rep else math.nan,
        f"{prefix}_precision": tp / (tp + fp) if tp + fp else 0.0,
        f"{prefix}_auc": auc_from_histograms(tally[f"{prefix}_hist_replaced"], tally[f"{prefix}_hist_original"]),
        f"{prefix}_acc": (tp + (n - n_rep - fp)) / n if n else math.nan,  # (true positives + true negatives) / n
        f"{prefix}_loss": tally[f"{prefix}_nll"] / n if n else math.nan,
        f"{prefix}_base_acc": 1 - rate,  # always "original"
        f"{prefix}_base_loss": (
            -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)) if 0 < rate < 1 else 0.0
        ),  # the base rate, every token alike
        f"{prefix}_replaced_frac": rate,
        **({f"{prefix}_token_auc": token_alone_auc(prefix, tally)} if f"{prefix}_token_replaced_a" in tally else {}),
    }


# Detection is past its baseline with AUC 0.75 and a tenth of the replacements found, and at least this far
# above the token alone (where the tally has it); within TOKEN_TIE of the token alone it is at its baseline.
TOKEN_MARGIN, TOKEN_TIE = 0.05, 0.01


def detection_check(head: str, prefix: str, m: dict[str, float]) -> HeadCheck:
    """Replaced-token detection beside the better of its two trivial baselines: always answering "original"
    (AUC 0.5) and, where the tally has the per-token counts, a detector that sees each token alone
    (:func:`token_alone_auc`): a generator's replacements that are rare or out-of-place words are told apart
    by the word itself, and a discriminator that has learned only which words get replaced scores that
    AUC without reading any context (a generator sampling at a temperature above 1 makes many such
    replacements: docs/learning.md)."""
    recall, auc = m[f"{prefix}_recall"], m[f"{prefix}_auc"]
    token = m.get(f"{prefix}_token_auc", math.nan)
    alone = not math.isnan(token)
    past = auc >= 0.75 and recall >= 0.1 and (not alone or auc >= token + TOKEN_MARGIN)
    at = recall < 0.02 or auc < 0.55 or (alone and auc < token + TOKEN_TIE)
    status = PAST if past else AT if at else ABOVE
    detail = (
        f"recall {recall:.3f}, precision {m[f'{prefix}_precision']:.3f}, accuracy {m[f'{prefix}_acc']:.3f} "
        f"(always original: {m[f'{prefix}_base_acc']:.3f}), loss {m[f'{prefix}_loss']:.4f} "
        f"(base rate: {m[f'{prefix}_base_loss']:.4f})"
    )
    if alone:
        return HeadCheck(head, f"{prefix}_auc", auc, token, "the token alone", status, detail)
    return HeadCheck(head, f"{prefix}_auc", auc, 0.5, "always original", status, detail)


# --- sentence-pair heads -----------------------------------------------------------------------------
def pair_tally(prefix: str, logits: torch.Tensor, labels: torch.Tensor) -> Tally:
    return {
        f"{prefix}_n": torch.tensor(float(len(labels)), dtype=torch.float64, device=labels.device),
        f"{prefix}_correct": (logits.argmax(-1) == labels).sum().double(),
        f"{prefix}_positive": labels.sum().double(),
    }


def pair_metrics(prefix: str, tally: dict) -> dict[str, float]:
    n, correct, positive = (tally[f"{prefix}_{k}"] for k in ("n", "correct", "positive"))
    return {
        f"{prefix}_acc": correct / n if n else math.nan,
        f"{prefix}_majority": max(positive, n - positive) / n if n else math.nan,
        f"{prefix}_n": n,
    }


def pair_check(head: str, prefix: str, m: dict[str, float]) -> HeadCheck:
    acc, base, n = m[f"{prefix}_acc"], m[f"{prefix}_majority"], m[f"{prefix}_n"]
    z = (acc - base) * math.sqrt(n) / math.sqrt(base * (1 - base)) if n and 0 < base < 1 else 0.0
    status = PAST if z >= 3 and acc >= base + 0.05 else AT if z < 3 or acc < base + 0.02 else ABOVE
    return HeadCheck(head, f"{prefix}_acc", acc, base, "majority label", status, f"{int(n)} pairs")


__all__ = [
    "ABOVE",
    "AT",
    "PAST",
    "HeadCheck",
    "Tally",
    "COLLAPSED",
    "add",
    "auc_from_histograms",
    "collapsed",
    "detection_check",
    "detection_metrics",
    "detection_tally",
    "held_out_tally",
    "judge",
    "masked_check",
    "masked_metrics",
    "masked_tally",
    "pair_check",
    "pair_metrics",
    "pair_tally",
    "states_line",
    "states_metrics",
    "states_tally",
    "to_host",
    "token_alone_auc",
]
