#!/usr/bin/env bash
# Train (then evaluate) one experiment on this machine's CPU, one device.
#
#   launch/local.sh [EXPERIMENT] [SCALE] [TRAIN_STEPS] [-- extra mtf_th flags]
#   launch/local.sh experiments/t5_heads/07_talking_heads_24_32.gin models/t5_tiny.gin 2000
#
# Defaults: the paper's 24-head talking-heads T5 row at tiny scale, on the
# embedded corpus, into runs/<experiment name>.  Resumes if run again.
set -euo pipefail
cd "$(dirname "$0")/.."
EXPERIMENT="${1:-experiments/t5_heads/07_talking_heads_24_32.gin}"
SCALE="${2:-models/t5_tiny.gin}"
STEPS="${3:-2000}"
shift $(( $# < 3 ? $# : 3 ))
[[ "${1:-}" == "--" ]] && shift
NAME="$(basename "$(dirname "$EXPERIMENT")")_$(basename "$EXPERIMENT" .gin)"
MODEL_DIR="${MODEL_DIR:-runs/$NAME}"
MTF_TH="${MTF_TH:-.venv/bin/mtf_th}"
set -x
"$MTF_TH" train --model_dir="$MODEL_DIR" --gin_file="$EXPERIMENT" \
  --gin_file="$SCALE" --gin_param="mesh_shape = 'model:1'" \
  --train_steps="$STEPS" "$@"
"$MTF_TH" eval --model_dir="$MODEL_DIR" --gin_file="$EXPERIMENT" \
  --gin_file="$SCALE" --gin_param="mesh_shape = 'model:1'" "$@"
