set -x
cd /work/wt/lead7
export PYTHONPATH=$PWD:/work/wt/_notes/runs4/copy TF_ENABLE_ONEDNN_OPTS=0
M=/work/main/.venv/bin/mtf_th
D=/work/wt/_notes/runs7/abspos/copy128_abs
$M train --module_import copy128_task --model_dir $D \
  --gin_file experiments/encdec_heads/02_multi_head_8_16.gin --gin_file objectives/copy_bytes.gin \
  --gin_param "MIXTURE_NAME = 'th_copy128_bytes'" --gin_param "inputs_length = 129" --gin_param "targets_length = 129" \
  --gin_param "transformer.Unitransformer.positional_embedding = True" \
  --gin_param "seed = 1" --gin_param "train_steps = 1000" --gin_param "save_checkpoints_steps = 250"
$M eval --module_import copy128_task --model_dir $D --checkpoint_steps 500,1000
$M eval --module_import copy128_task --metrics --task th_copy128_bytes --model_dir $D --checkpoint_steps 1000
