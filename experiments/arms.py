"""Recipe arms are studies of pretraining only now: an arms file is an ablation preset in ``conf/ablation/``
(``arms``, ``pretrain`` for the settings every arm shares, ``evals: []``), run by ``experiments/ablate.py``,
whose report says when each head left its baseline (``pretrainlab.studies.recipe``). This old entry point
names the command that does what it did, and runs nothing."""

import sys
from pathlib import Path

NEW = """recipe arms are studies of pretraining only now, and experiments/arms.py runs nothing: an arms file is a preset
in conf/ablation/ (arms; pretrain: the settings every arm shares, its old `common`; evals: []), and

    python experiments/ablate.py +ablation={name} [corpus=<data>] [jobs=N] [minutes=M] [output_root=<dir>] [study=<name>]

runs it (--out <dir>: output_root and study; --jobs: jobs; --minutes: minutes; train.py overrides after the file:
the preset's pretrain list). Its report, <output_root>/<study>/report/report.md and curves.csv, is the one
experiments/arms.py wrote (python tools/docs.py publish takes it). Presets: {presets}."""

if __name__ == "__main__":
    given = next((a for a in sys.argv[1:] if a.endswith((".yaml", ".yml"))), "<preset>")
    presets = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "ablation").glob("*.yaml"))
    print(NEW.format(name=Path(given).stem, presets=", ".join(presets)), file=sys.stderr)
    sys.exit(2)
