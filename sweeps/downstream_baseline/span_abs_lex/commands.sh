# Scratch: the absolute-position span base fine-tuned on the lexical tasks (acceptability, misspelling)
set -x
cd /work/wt/lead7
export PYTHONPATH=$PWD TF_ENABLE_ONEDNN_OPTS=0
M=/work/main/.venv/bin/mtf_th
P=/work/wt/_notes/runs7/abspos/span_abs
ABS=(--gin_param "transformer.Unitransformer.positional_embedding = True" --gin_param "transformer.Unitransformer.max_length = 160")
F=/work/wt/_notes/runs7/abspos/span_abs_lex
$M finetune --pretrained_model_dir $P --model_dir $F \
  --gin_file experiments/span_heads/01_multi_head_8_16.gin --gin_file experiments/finetune_embedded.gin \
  "${ABS[@]}" --gin_param "seed = 1" --gin_param "train_steps = 1000" \
  --gin_param "MIXTURE_NAME = 'th_finetune_lexical_bytes'" \
  --gin_param "learning_rate_schedules.constant_learning_rate.learning_rate = 0.01" \
  --gin_param "dropout_rate = 0.0" --gin_param "save_checkpoints_steps = 500" \
  --checkpoint_step 1000 --finetune_steps 2000
for s in 2000 3000; do $M eval --metrics --model_dir $F --checkpoint_steps $s; done
