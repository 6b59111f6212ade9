"""The whole study in one GPU slot, started on a machine that may lack the project's dependencies:

    python experiments/slot.py run --inputs .slot/inputs.tar.xz --wheels .slot/wheels --seed 0 --out <dir>

It installs what is missing from the wheels folder (offline: ``pip install --no-index``), then runs
``python -m pretrainlab.slot`` with the same arguments (any of its commands: pack, wheels, run,
merge): in a fresh interpreter after an installation, in this one otherwise. Only the standard library
is used before the installation. docs/slot.md says what to carry.
"""

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

STARTED = time.time()
ROOT = Path(__file__).resolve().parents[1]

# module -> distribution: what a slot imports, beyond the standard library
NEEDED = {
    "torch": "torch",
    "lightning": "lightning",
    "numpy": "numpy",
    "pyarrow": "pyarrow",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "filelock": "filelock",
    "yaml": "PyYAML",
    "tqdm": "tqdm",
    "scipy": "scipy",
    "matplotlib": "matplotlib",
    "omegaconf": "omegaconf",
    "antlr4": "antlr4-python3-runtime",
    "hydra": "hydra-core",
}


def _wheels(argv: list[str]) -> Path:
    if "--wheels" in argv and argv.index("--wheels") + 1 < len(argv):
        return Path(argv[argv.index("--wheels") + 1])
    return ROOT / ".slot" / "wheels"


def install_missing(argv: list[str]) -> dict:
    """Install the distributions of ``NEEDED`` whose modules this Python cannot import, from the wheels
    folder, without the network; returns what was installed and how long it took."""
    missing = [dist for module, dist in NEEDED.items() if importlib.util.find_spec(module) is None]
    if not missing:
        return {"packages": [], "seconds": 0.0}
    wheels = _wheels(argv)
    if not wheels.is_dir():
        sys.exit(
            f"slot: this Python lacks {', '.join(missing)} and there is no wheels folder at {wheels}. Make one on a "
            f"machine with the package index (python -m pretrainlab.slot wheels --out {wheels}), carry it here, "
            f"and name it with --wheels."
        )
    t = time.time()
    print(f"slot: installing {', '.join(missing)} from {wheels}", flush=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels), *missing]
    )
    if done.returncode != 0:
        sys.exit(
            f"slot: installing {', '.join(missing)} from {wheels} failed (above). Add the missing wheels with "
            f"python -m pretrainlab.slot wheels --out {wheels} --also <requirement> on a machine with the package index."
        )
    importlib.invalidate_caches()
    return {"packages": missing, "seconds": round(time.time() - t, 1)}


def main() -> None:
    argv = sys.argv[1:]
    installed = install_missing(argv) if argv[:1] == ["run"] else {"packages": [], "seconds": 0.0}
    env = dict(
        os.environ,
        PRETRAINLAB_SLOT_STARTED=repr(STARTED),
        PRETRAINLAB_SLOT_INSTALLED=json.dumps(installed),
        PRETRAINLAB_COMMAND=shlex.join(["python", sys.argv[0], *argv]),  # what the slot's reports and hints name
    )
    from_src = importlib.util.find_spec("pretrainlab") is None  # a copy of the project, not installed
    if from_src:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])])
    if installed["packages"]:  # a fresh interpreter imports what was just installed
        os.execve(sys.executable, [sys.executable, "-m", "pretrainlab.slot", *argv], env)
    # nothing installed: `python -m pretrainlab.slot` in this interpreter, which keeps what it has imported
    # already (all of it when this script was forked from a process that had: tests/conftest.py's commands)
    import runpy

    os.environ.update(env)
    sys.path[0] = os.getcwd()  # python -m's first path entry, not this script's folder
    if from_src:  # what PYTHONPATH gives the processes it starts
        sys.path.insert(1, str(ROOT / "src"))
    sys.argv = ["-m", *argv]  # runpy puts the module's file first, as python -m does
    runpy.run_module("pretrainlab.slot", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
