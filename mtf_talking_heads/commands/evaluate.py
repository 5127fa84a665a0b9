"""Held-out ln(PPL) (mean token cross-entropy, nats) of checkpoints.

  mtf_th eval --model_dir=runs/th24 [--checkpoint_steps=100,200|all]
      [--gin_file=... --gin_param=...]

Without --gin_file the model's operative_config.gin is used.  Prints one
row per checkpoint and writes/updates <model_dir>/eval_results.csv
(step,split,ln_ppl,tokens).  The split is gin
mtf_th.evaluate_checkpoints.split (default "validation").  Configuration
errors exit with status 2, a failing op with status 1, each with one line.
"""
import sys

from mtf_talking_heads import commands
from mtf_talking_heads.commands import train as train_command

PROG = "mtf_th eval"


def parse_steps(text):
  """"100,200" -> [100, 200]; "all" -> "all"; "" / "latest" -> None."""
  if text is None or text in ("", "latest"):
    return None
  if text == "all":
    return "all"
  try:
    steps = [int(s) for s in text.split(",") if s.strip()]
  except ValueError:
    raise commands.UsageError(
        "--checkpoint_steps must be comma-separated integers, 'all' or "
        "'latest', got %r" % text)
  if not steps or any(s < 0 for s in steps):
    raise commands.UsageError(
        "--checkpoint_steps must list non-negative steps, got %r" % text)
  return steps


def main(argv=None):
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  train_command.add_common_flags(parser, "the trained model")
  parser.add_argument("--checkpoint_steps", default=None,
                      help="comma-separated steps, 'all' or 'latest' "
                           "(default)")
  argv = sys.argv[1:] if argv is None else argv

  def body(args, training):
    try:
      steps = parse_steps(args.checkpoint_steps)
    except commands.UsageError as e:
      raise training.ConfigError(str(e))
    results = training.evaluate(args.model_dir, args.gin_file, args.gin_param,
                                checkpoint_steps=steps, tpu=args.tpu,
                                tpu_zone=args.tpu_zone,
                                gcp_project=args.gcp_project)
    print("step,split,ln_ppl,tokens")
    for r in results:
      print("%d,%s,%.6f,%d" % (r["step"], r["split"], r["ln_ppl"],
                               r["tokens"]))
    return 0

  return train_command.run_command(PROG, parser, argv, body)


if __name__ == "__main__":
  sys.exit(main())
