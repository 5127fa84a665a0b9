"""Held-out ln(PPL) (mean token cross-entropy, nats) of checkpoints, or --metrics: downstream metrics.

  mtf_th eval --model_dir=runs/th24 [--checkpoint_steps=100,200|all]
      [--gin_file=... --gin_param=...]
  mtf_th eval --metrics --model_dir=runs/th24_ft [--max_eval_examples=N]
      [--task=th_finetune_embedded]

Without --gin_file the model's operative_config.gin is used.  Prints one
row per checkpoint and writes/updates <model_dir>/eval_results.csv
(step,split,ln_ppl,tokens).  The split is gin
mtf_th.evaluate_checkpoints.split (default "validation").  Configuration
errors exit with status 2, a failing op with status 1, each with one line.

--metrics (a fine-tuned text-to-text model: an encoder-decoder, or a
decoder-only model fine-tuned as delimited_lm): greedy-decodes the held-out
inputs of every task of the model's MIXTURE_NAME (or --task) that has
metric_fns, scores them with those (t5's accuracy, SQuAD exact match / F1,
...), prints task,metric,value,step,examples and writes/updates
<model_dir>/downstream_results.csv.  One checkpoint: the latest, or the
single step of --checkpoint_steps.
"""
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import common
from mtf_talking_heads.commands import file_checks
from mtf_talking_heads.commands import prechecks

PROG = "mtf_th eval"


def parse_steps(text):
  """"100,200" -> [100, 200]; "all" -> "all"; "" / "latest" -> None."""
  if text is None or text in ("", "latest"):
    return None
  if text == "all":
    return "all"
  return prechecks.step_list(text, "--checkpoint_steps")  # or 'all', 'latest'


def main(argv=None):
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  common.add_common_flags(parser, "the trained model")
  parser.add_argument("--checkpoint_steps", default=None,
                      help="comma-separated steps, 'all' or 'latest' "
                           "(default)")
  parser.add_argument("--metrics", action="store_true",
                      help="downstream metrics of a fine-tuned model "
                           "(decode + the tasks' metric_fns) instead of "
                           "ln(PPL)")
  parser.add_argument("--task", default=None, metavar="NAME",
                      help="with --metrics: the task or mixture to score "
                           "(default: the model's MIXTURE_NAME)")
  parser.add_argument("--max_eval_examples", default=None,
                      type=common.positive_int, metavar="N",
                      help="with --metrics: at most N held-out examples per "
                           "task (default: all)")
  parser.add_argument("--data_dir", default=None, metavar="DIR",
                      help="with --metrics: TFDS data directory of t5's "
                           "tasks (e.g. gs://BUCKET/tensorflow_datasets)")
  argv = sys.argv[1:] if argv is None else argv

  def body(args, training):
    try:
      steps = parse_steps(args.checkpoint_steps)
    except commands.UsageError as e:
      raise training.ConfigError(str(e)) from e
    if args.metrics:
      return _metrics(args, training, steps)
    results = training.evaluate(args.model_dir, args.gin_file, args.gin_param,
                                checkpoint_steps=steps, tpu=args.tpu,
                                tpu_zone=args.tpu_zone,
                                gcp_project=args.gcp_project)
    print("step,split,ln_ppl,tokens")
    for r in results:
      print("%d,%s,%.6f,%d" % (r["step"], r["split"], r["ln_ppl"],
                               r["tokens"]))
    return 0

  def precheck(args):
    parse_steps(args.checkpoint_steps)
    if not args.metrics and (args.task or args.max_eval_examples or
                             args.data_dir):
      raise commands.UsageError("--task, --max_eval_examples and --data_dir "
                                "go with --metrics")
    common.check_common(
        args, writes=False,
        purpose=("downstream_results.csv" if args.metrics else
                 "eval_results.csv and the eval events"))
    file_checks.damaged_files(
        args.model_dir, steps=parse_steps(args.checkpoint_steps),
        logs=() if args.metrics else ("eval_results.csv",))
    if args.metrics:  # this package's and t5's names (data/task_names.py)
      prechecks.task(args.task, prechecks.run_gin_files(
          args.model_dir, args.gin_file), "--task", args.module_import)
      prechecks.text_to_text(args.model_dir, args.gin_file, args.gin_param,
                             "downstream metrics decode text: scoring")
    if not args.tpu and not args.cluster:  # as common.memory_check
      prechecks.forward_memory(args.model_dir, args.gin_file, args.gin_param,
                               "eval")

  return common.run_command(PROG, parser, argv, body, precheck)


def _metrics(args, training, steps):
  """mtf_th eval --metrics: one checkpoint's downstream metrics."""
  if steps == "all" or (isinstance(steps, list) and len(steps) != 1):
    raise training.ConfigError(
        "--metrics scores one checkpoint: give one step in "
        "--checkpoint_steps (or none: the latest), got %r"
        % args.checkpoint_steps)
  from mtf_talking_heads.commands import finetune as finetune_command  # pylint: disable=g-import-not-at-top
  finetune_command.check_tfds_data(args, training)
  results = training.score(
      args.model_dir, args.gin_file, args.gin_param,
      checkpoint_step=steps[0] if steps else None,
      mixture_or_task_name=args.task, max_examples=args.max_eval_examples,
      tpu=args.tpu, tpu_zone=args.tpu_zone, gcp_project=args.gcp_project)
  print("task,metric,value,step,examples")
  for r in results:
    print("%s,%s,%.4f,%d,%d" % (r["task"], r["metric"], r["value"],
                                r["step"], r["examples"]))
  return 0


if __name__ == "__main__":
  sys.exit(main())
