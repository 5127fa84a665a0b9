#!/usr/bin/env bash
# Train one experiment on N local `mtf_th server` processes (docs/cluster.md).
#
#   launch/cluster.sh [TASKS] [DEVICES_PER_TASK] [TRAIN_STEPS] [-- extra mtf_th train flags]
#   launch/cluster.sh 2 2 20 -- --gin_param="heads = 8"
#
# Starts TASKS servers on free localhost ports (each with DEVICES_PER_TASK
# logical CPU devices), waits until each listens, trains the 24-head
# talking-heads T5 at tiny scale on mesh model:TASKS*DEVICES_PER_TASK
# (heads, d_ff and vocab split over the model dimension) into
# runs/cluster_<TASKS>x<DEVICES_PER_TASK> (MODEL_DIR overrides), and stops
# the servers by PID when it exits (also on Ctrl-C or an error).  Rerun it to
# resume.  Defaults: 2 tasks, 1 device each, 20 steps.
set -euo pipefail
cd "$(dirname "$0")/.."
TASKS="${1:-2}"
K="${2:-1}"
STEPS="${3:-20}"
shift $(( $# < 3 ? $# : 3 ))
[[ "${1:-}" == "--" ]] && shift
MTF_TH="${MTF_TH:-.venv/bin/mtf_th}"
PYTHON="${PYTHON:-$(dirname "$MTF_TH")/python}"
MODEL_DIR="${MODEL_DIR:-runs/cluster_${TASKS}x${K}}"
LOGS="$(mktemp -d)"
PORTS="$("$PYTHON" -c "import sys
from mtf_talking_heads.runtime import cluster
print(' '.join(map(str, cluster.free_ports(int(sys.argv[1])))))" "$TASKS")"
SPEC="$(for p in $PORTS; do printf 'localhost:%s,' "$p"; done)"
SPEC="${SPEC%,}"
PIDS=()
stop() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$LOGS"
}
trap stop EXIT
for ((task = 0; task < TASKS; task++)); do
  "$MTF_TH" server --cluster "$SPEC" --task "$task" \
    --devices_per_task "$K" >"$LOGS/$task.out" 2>"$LOGS/$task.err" &
  PIDS+=("$!")
done
for ((task = 0; task < TASKS; task++)); do
  until grep -q listening "$LOGS/$task.out"; do
    if ! kill -0 "${PIDS[$task]}" 2>/dev/null; then
      echo "launch/cluster.sh: server task $task did not start:" >&2
      tail -5 "$LOGS/$task.err" >&2
      exit 1
    fi
    sleep 1
  done
  cat "$LOGS/$task.out"
done
set -x
"$MTF_TH" train --model_dir="$MODEL_DIR" \
  --gin_file=experiments/t5_heads/07_talking_heads_24_32.gin \
  --gin_file=models/t5_tiny.gin \
  --gin_param="mesh_shape = 'model:$((TASKS * K))'" \
  --gin_param="layout = 'heads:model,d_ff:model,vocab:model'" \
  --train_steps="$STEPS" --cluster="$SPEC" --devices_per_task="$K" "$@"
