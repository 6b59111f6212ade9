#!/usr/bin/env bash
# A study of pretraining only (recipe arms: a preset of conf/ablation/ with evals: []) on a GPU machine that
# lacks hydra (an offline node): install it from the carried wheels, unpack the slot's inputs (the tokenized
# corpus), run the study for at most [minutes], archive its runs' curves and its report.
#
#   bash experiments/arms_on_device.sh <preset> <inputs.tar.xz> <wheels dir> <out dir> [minutes] [study overrides...]
#
# <out>/arms.tar.gz holds every run's config, learning.csv and log, and the report (no weights).
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=$1 INPUTS=$2 WHEELS=$3 OUT=$4 MINUTES=${5:-7}
shift 4; [ $# -gt 0 ] && shift
PY=${PYTHON:-python3}
WORK=${ARMS_WORK:-/tmp/pretrainlab-arms}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} WANDB_MODE=offline
"$PY" -c "import hydra, omegaconf" 2>/dev/null ||
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" hydra-core omegaconf antlr4-python3-runtime
CORPUS=$("$PY" -c "from pretrainlab.slot.inputs import unpack; print(unpack('$INPUTS', '$WORK')[0] / 'corpus')")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$WORK/gpu.txt" 2>/dev/null || true
status=0
"$PY" experiments/ablate.py "+ablation=$PRESET" study=arms "output_root=$WORK" "corpus=$CORPUS" \
  "minutes=$MINUTES" "$@" || status=$?
cp "$WORK/gpu.txt" "$WORK/arms/" 2>/dev/null || true
tar czf "$OUT/arms.tar.gz" -C "$WORK" --exclude=checkpoints --exclude='*.ckpt' --exclude='*.safetensors' arms
exit $status
