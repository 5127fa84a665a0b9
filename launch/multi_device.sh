#!/usr/bin/env bash
# Train (then evaluate) one experiment on a mesh of logical CPU devices
# (mtf's PlacementMeshImpl, one logical device per mesh slot).
#
#   launch/multi_device.sh [EXPERIMENT] [SCALE] [TRAIN_STEPS] [MESH] [LAYOUT]
#   launch/multi_device.sh experiments/t5_heads/07_talking_heads_24_32.gin \
#       models/t5_tiny.gin 2000 "model:8" "heads:model,d_ff:model,vocab:model"
#   launch/multi_device.sh ... 2000 "batch:2,model:4" \
#       "batch:batch,heads:model,d_ff:model,vocab:model"
#
# The mesh size may exceed the number of cores: logical devices share them.
# The batch size (8 at tiny scale) must be a multiple of the batch axis and
# the split dims (heads, d_ff, padded vocab) multiples of the model axis;
# mtf_th checks this before building anything.
set -euo pipefail
cd "$(dirname "$0")/.."
EXPERIMENT="${1:-experiments/t5_heads/07_talking_heads_24_32.gin}"
SCALE="${2:-models/t5_tiny.gin}"
STEPS="${3:-2000}"
MESH="${4:-model:8}"
LAYOUT="${5:-heads:model,d_ff:model,vocab:model}"
shift $(( $# < 5 ? $# : 5 ))
NAME="$(basename "$(dirname "$EXPERIMENT")")_$(basename "$EXPERIMENT" .gin)_${MESH//[:,]/_}"
MODEL_DIR="${MODEL_DIR:-runs/$NAME}"
MTF_TH="${MTF_TH:-.venv/bin/mtf_th}"
FLAGS=(--gin_file="$EXPERIMENT" --gin_file="$SCALE"
       --gin_param="mesh_shape = '$MESH'" --gin_param="layout = '$LAYOUT'")
set -x
"$MTF_TH" train --model_dir="$MODEL_DIR" "${FLAGS[@]}" --train_steps="$STEPS" "$@"
"$MTF_TH" eval --model_dir="$MODEL_DIR" "${FLAGS[@]}" "$@"
