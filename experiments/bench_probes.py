"""Time fitting an evaluation's probes one by one (``fit_probe``) against all at once (``fit_probes``),
on features of the NER probe's shape (words x layers x hidden), in the same run on the same device:

    python experiments/bench_probes.py                       # CPU, 20,000 words, 1 epoch
    python experiments/bench_probes.py --device cuda --words 67634 --hidden 256

Prints the seconds of each and their ratio, and the largest difference between the weights the two
ways end with (they fit the same probes: the same initial weights, batches and optimizer).
"""

import argparse
import time

import torch

from pretrainlab.evaluation.probes import Probe, fit_probe, fit_probes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--words", type=int, default=20000)
    p.add_argument("--layers", type=int, default=5, help="the embeddings and each layer (model=mini: 5)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=9)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=256)
    a = p.parse_args()
    device = torch.device(a.device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(a.words, a.layers, a.hidden, generator=gen).to(device)
    y = torch.randint(0, a.classes, (a.words,), generator=gen).to(device)
    configs = {f"layer_{i}": ([i], False) for i in range(a.layers)}
    configs["last4"] = (list(range(max(0, a.layers - 4), a.layers)), False)
    configs["mix"] = (list(range(a.layers)), True)

    def made() -> dict[str, Probe]:
        out = {}
        for name, (layers, mix) in configs.items():
            torch.manual_seed(0)
            out[name] = Probe(layers, a.hidden, a.classes, mix).to(device)
        return out

    def timed(fit) -> tuple[float, dict[str, Probe]]:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        probes = fit(made())
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t, probes

    args = (x, y, a.epochs, 1e-3, a.batch_size, 0.0, 0)
    timed(lambda ps: fit_probes(ps, x[: 4 * a.batch_size], y[: 4 * a.batch_size], 1, 1e-3, a.batch_size, 0.0, 0))
    alone_s, alone = timed(lambda ps: {k: fit_probe(v, *args) for k, v in ps.items()})
    together_s, together = timed(lambda ps: fit_probes(ps, *args))
    diff = max(
        (u - v).abs().max().item()
        for k in alone
        for u, v in zip(alone[k].parameters(), together[k].parameters(), strict=True)
    )
    steps = a.epochs * -(-a.words // a.batch_size)
    print(
        f"{len(configs)} probes, {a.words} x {a.layers} x {a.hidden} features, {steps} steps of {a.batch_size} "
        f"on {device}: one by one {alone_s:.2f} s, together {together_s:.2f} s ({alone_s / together_s:.1f}x); "
        f"largest weight difference {diff:.1e}"
    )


if __name__ == "__main__":
    main()
