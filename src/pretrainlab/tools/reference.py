"""Train the Hugging Face transformers reference on the batches a pretrainlab run trained on, and
judge both with the same learning checks.

    python experiments/reference.py runs/<run>                    # the run's objective, steps and settings
    python experiments/reference.py runs/<run> --steps 2000 --eval-every 250 --out ref.csv

The run's ``config.yaml`` gives the corpus, tokenizer, held-out split, encoder shape, objective and
optimiser. The reference is the objective's transformers peer of the same shape (``tools.peers``, the
one ``bench.py`` times; for RoBERTa, BertForMaskedLM: its objective on BERT's architecture, as pretrainlab
runs it).

It is trained on the same examples in the same order with the same masks (pretrainlab's data
module and collator, same seed), with the run's optimiser settings (AdamW groups, warmup and linear
decay over the steps, gradient clipping), and every ``--eval-every`` steps its heads are scored on
the run's held-out batches by ``objectives.learning`` exactly as the run scores its own. The table
puts the reference beside the run's ``learning.csv`` at the same steps: if the run's heads stay at
their trivial baseline where the reference's leave it, the fault is ours; if both stay, it is the
scale. The schedule is the run's budget (steps, tokens or FLOPs, counted as the run counts them),
so ``--steps`` can stop the reference early in the run's own schedule. CPU or one GPU.
"""

from __future__ import annotations

import argparse
import csv
import io
import logging
import math
from pathlib import Path
from typing import cast

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from pretrainlab import atomic
from pretrainlab.data.datamodule import PretrainDataModule
from pretrainlab.model.vocab_loss import sample
from pretrainlab.objectives import learning
from pretrainlab.objectives.electra import ELECTRA
from pretrainlab.pretraining.assembly import build_model
from pretrainlab.pretraining.learning_log import FILE, read_rows
from pretrainlab.pretraining.run import build_budget, build_data
from pretrainlab.tools.bench import hf_labels
from pretrainlab.tools.peers import PEERS  # the same-shape transformers models

log = logging.getLogger("pretrainlab")


def reference_model(name: str, config, vocab_size: int):
    return PEERS[name].model(config, vocab_size, reference=True)


def at_slots(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """(batch, seq, vocab) logits at the batch's (batch, slots) masked positions."""
    positions = batch["mlm_positions"]
    return logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))


def loss_and_tally(objective, model, batch: dict, tally: bool) -> tuple[torch.Tensor, dict]:
    """The reference's training loss on our batch, and (``tally``) its heads' counts as
    ``objectives.learning`` takes them."""
    name, mask_id = objective.name, objective.tokens.mask_id
    ids, mask = batch["input_ids"], batch["attention_mask"]
    types = batch.get("token_type_ids", torch.zeros_like(ids))
    positions, originals = batch["mlm_positions"], batch["mlm_labels"]
    shown = ids.gather(1, positions)
    counts: dict = {}
    if PEERS[name].heads is None:  # ELECTRA: the generator's sample, then the discriminator
        gen = model.gen(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=hf_labels(batch))
        # the discriminator's input as pretrainlab makes it: a sample at each masked position, at the batch's
        # own uniforms, put in place by ELECTRA.replace
        at = at_slots(gen.logits, batch)
        sampled = sample(
            at.reshape(-1, at.shape[-1]).float(), objective.temperature, batch["sample_uniform"].reshape(-1)
        ).view_as(positions)
        disc_ids, replaced = ELECTRA.replace(ids, positions, originals, sampled)
        disc = model.disc(input_ids=disc_ids, token_type_ids=types, attention_mask=mask, labels=replaced.long())
        loss = gen.loss + objective.disc_weight * disc.loss
        if tally:
            counts = learning.masked_tally("gen", lambda h: h, at, originals, shown, mask_id, at.shape[-1])
            counts |= learning.detection_tally("rtd", disc.logits, replaced, mask, disc_ids, at.shape[-1])
        return loss, counts
    at, pair = masked_heads(name, model, ids, types, mask, positions)
    loss = torch.nn.functional.cross_entropy(at.reshape(-1, at.shape[-1]).float(), originals.reshape(-1))
    if pair is not None:
        loss = loss + torch.nn.functional.cross_entropy(pair.float(), batch["labels"])
    if tally:
        counts = learning.masked_tally("mlm", lambda h: h, at, originals, shown, mask_id, at.shape[-1])
        if pair is not None:
            counts |= learning.pair_tally(objective.pair_task, pair.float(), batch["labels"])
    return loss, counts


def masked_heads(name: str, model, ids, types, mask, positions) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The transformers model's own modules, its masked-LM head applied at the masked positions only:
    (batch, slots, vocab) logits there, and the pair head's logits (None for RoBERTa). The head works
    position by position, so this is the loss and the gradients of the model's full forward with
    labels (``check_masked_heads``) without the full-sequence vocabulary projection, which makes the
    reference's step several times slower than the run's on a small model."""
    peer = PEERS[name]
    assert peer.body is not None and peer.heads is not None, f"{name}'s reference computes its own loss"
    out = getattr(model, peer.body)(input_ids=ids, token_type_ids=types, attention_mask=mask)
    hidden = out[0].gather(1, positions[..., None].expand(-1, -1, out[0].shape[-1]))
    return peer.heads(model, hidden, out[1] if len(out) > 1 else None)


def check_masked_heads(objective, model, batch: dict) -> None:
    """Refuse to go on when the masked-positions loss (:func:`loss_and_tally`) is not the transformers
    model's own loss with labels on ``batch``."""
    name = objective.name
    peer = PEERS[name]
    if peer.heads is None:
        return
    kwargs = {peer.pair_label: batch["labels"]} if peer.pair_label else {}
    module = model.module if hasattr(model, "module") else model
    rng = torch.get_rng_state()  # dropout draws: both forwards see the same, and training the ones it would have
    with torch.no_grad():
        module.eval()
        theirs = model(
            input_ids=batch["input_ids"],
            token_type_ids=batch.get("token_type_ids", torch.zeros_like(batch["input_ids"])),
            attention_mask=batch["attention_mask"],
            labels=hf_labels(batch),
            **kwargs,
        ).loss
        ours = loss_and_tally(objective, model, batch, tally=False)[0]
        module.train()
    torch.set_rng_state(rng)
    if not torch.isclose(ours.float(), theirs.float(), rtol=1e-4, atol=1e-5):
        raise RuntimeError(
            f"the {name} reference's loss at the masked positions ({float(ours):.6f}) is not the transformers "
            f"model's own loss ({float(theirs):.6f}) on the same batch"
        )


def evaluate(model, objective, batches) -> tuple[dict, list]:
    module = model.module if hasattr(model, "module") else model
    module.eval()
    total = None
    with torch.no_grad():
        for batch in batches:
            total = learning.add(total, loss_and_tally(objective, model, batch, tally=True)[1])
    module.train()
    return objective.learning(learning.to_host(total or {}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run", type=Path, help="a pretrainlab run directory (its config.yaml and learning.csv)")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="stop after this many optimizer steps, the learning-rate schedule still the run's "
        "(default: where the run's budget ends)",
    )
    p.add_argument(
        "--eval-every", type=int, default=None, help="steps between evaluations (default: the run's val_every)"
    )
    p.add_argument("--eval-batches", type=int, default=None, help="held-out batches per evaluation (default: all)")
    p.add_argument("--out", type=Path, default=None, help="CSV of the reference's learning curve")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.out is not None and args.out.exists():
        p.error(f"--out {args.out} already exists: name a new file (or move that one away); it is not written over.")

    cfg = cast(DictConfig, OmegaConf.load(args.run / "config.yaml"))
    if (cfg.get("budget") or {}).get("minutes") is not None:
        p.error(
            f"{args.run} was trained to budget.minutes, which says nothing of the steps its schedule took; "
            "the reference follows step, token and FLOPs budgets."
        )
    every = args.eval_every or int(cfg.val_every)
    torch.manual_seed(int(cfg.seed))
    data, tokens = build_data(cfg)
    model = build_model(cfg, tokens)
    config, objective = model.encoder_config, model.objective
    name = objective.name
    if name not in PEERS:
        p.error(f"objective {name} has no transformers reference here (tools/peers.py: {', '.join(PEERS)})")
    if int(cfg.get("device_batch_size") or cfg.batch_size) != int(cfg.batch_size):
        p.error("the reference trains without gradient accumulation: the run's device_batch_size must equal batch_size")
    datamodule = PretrainDataModule(
        data,
        objective.example_builder(cfg.max_seq_len),
        objective.collator(None),
        int(cfg.batch_size),
        int(cfg.seed),
        num_workers=0,
    )
    datamodule.prepare()
    assert datamodule.train_store is not None, "a local corpus has its examples"
    objective.token_counts = datamodule.train_store.token_counts(tokens.vocab_size)  # the unigram baselines
    model = reference_model(name, config, tokens.vocab_size)
    module = model.module if hasattr(model, "module") else model
    optim = instantiate(cfg.optim)
    opt = optim.optimizer(module)
    # the run's budget and schedule: warmup and decay over its steps, tokens or FLOPs, counted as the run
    # counts them (each batch's tokens x the objective's FLOPs per token)
    flops_per_token = float(objective.mean_flops_per_token(config, cfg.max_seq_len))
    budget = build_budget(cfg, datamodule, flops_per_token)
    schedule = budget.schedule(opt, optim)
    budget.start(0.0)
    steps = args.steps or budget.planned_steps()
    if steps is None:
        p.error("the run's budget plans no steps: give --steps")
    seen = 0.0
    val = list(datamodule.val_dataloader())
    if args.eval_batches:
        val = val[: args.eval_batches]
    ours = {int(r["step"]): r for r in read_rows(args.run / FILE)}
    rows = []
    step, epoch = 0, 0
    module.train()
    done = False
    while not done:
        loader = datamodule.train_dataloader()
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]  # the datamodule's epoch sampler
        for batch in loader:
            # the run's count (PretrainModule._count, one process): the batch's own number, else its n_tokens
            seen += float(batch["global_tokens"] if "global_tokens" in batch else batch["n_tokens"])
            batch = {k: v for k, v in batch.items() if k != "global_tokens"}
            if step == 0:
                check_masked_heads(objective, model, batch)
            loss, _ = loss_and_tally(objective, model, batch, tally=False)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if optim.grad_clip:
                torch.nn.utils.clip_grad_norm_(module.parameters(), optim.grad_clip)
            opt.step()
            step += 1
            budget.record(budget.measure(step, seen, seen * flops_per_token, 0.0))
            schedule.step()
            done = step >= steps or budget.reached
            if step % every == 0 or done:
                metrics, checks = evaluate(model, objective, val)
                row = {"step": step, "loss": float(loss.detach()), "lr": schedule.get_last_lr()[0]}
                row |= {k: v for k, v in metrics.items() if "loss" in k}  # the losses move before the accuracies
                mine = ours.get(step, {})
                for k in (k for k in metrics if k.endswith("loss_at_mask")):
                    log.info(
                        "step %d  %s: reference %.3f | pretrainlab %s",
                        step,
                        k,
                        metrics[k],
                        f"{float(mine[k]):.3f}" if mine.get(k) else "no validation at this step",
                    )
                for c in checks:
                    row |= {f"value:{c.head}": c.value, f"baseline:{c.head}": c.baseline, f"status:{c.head}": c.status}
                    theirs = (
                        f"pretrainlab {float(mine[f'value:{c.head}']):.3f} ({mine[f'status:{c.head}']})"
                        if mine.get(f"value:{c.head}")
                        else "pretrainlab: no validation at this step"
                    )
                    log.info(
                        "step %d  %s: reference %.3f vs baseline %.3f (%s) | %s",
                        step,
                        c.head,
                        c.value,
                        c.baseline,
                        c.status,
                        theirs,
                    )
                rows.append(row)
            if done:
                break
        epoch += 1
    if args.out:
        text = io.StringIO()
        writer = csv.DictWriter(text, list(dict.fromkeys(k for r in rows for k in r)), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic.write_text(args.out, text.getvalue())
        log.info("reference learning curve -> %s", args.out)
    return 0 if all(math.isfinite(r["loss"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
