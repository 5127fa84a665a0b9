"""Train tiny multi-head and talking-heads T5s on CPU and compare them.

  mtf_th demo [--output_dir=demo_output] [--train_steps=N] [--mesh_shape=model:4]

What `make demo` runs.  On the embedded corpus (built, with its vocabulary,
on first use), trains the tiny versions of two rows of the paper's Table 1
(multi-head h = 24, d_k = d_v = 32 and talking-heads h_k = h = h_v = 24)
on a model-parallel mesh of logical CPU devices (heads split over `model`),
evaluates both on the held-out split, and prints a markdown table: ln(PPL),
median step time, parameters and multiplies per attention layer
(costs.attention_costs at the tiny d_model and n = m = inputs length).
Writes <output_dir>/{multi_head,talking_heads}/ (checkpoints, logs),
<output_dir>/results.md and <output_dir>/loss_curves.png.  A second run
resumes (use --fresh to start over).
"""
import os
import shutil
import sys
import time

from mtf_talking_heads import commands
from mtf_talking_heads.commands import train as train_command

PROG = "mtf_th demo"
ROWS = (
    ("multi_head", "experiments/t5_heads/03_multi_head_24_32.gin"),
    ("talking_heads", "experiments/t5_heads/07_talking_heads_24_32.gin"),
)
SCALE = "models/t5_tiny.gin"


def _median(values):
  values = sorted(values)
  if not values:
    return float("nan")
  mid = len(values) // 2
  return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] +
                                                     values[mid])


def step_seconds(rows, skip=10):
  """Median seconds per step, ignoring the first `skip` steps (start-up)."""
  return _median([1.0 / r["steps_per_sec"] for r in rows
                  if r["step"] > skip and r["steps_per_sec"] > 0])


def row_costs(training, models, costs, gin_files, gin_params):
  """Macros and per-attention-layer costs of one configuration."""
  training.parse_gin(gin_files, gin_params)
  macros = {k: models.query(k) for k in ("row_label", "variant", "heads_k",
                                         "heads", "heads_v", "d_k", "d_v",
                                         "d_model", "inputs_length")}
  c = costs.attention_costs(
      macros["variant"], macros["heads_k"], macros["heads"],
      macros["heads_v"], macros["d_k"], macros["d_v"],
      d_model=macros["d_model"], length=macros["inputs_length"])
  macros.update(params=c["params"], multiplies=c["multiplies"])
  return macros


def format_table(results):
  """The side-by-side markdown table."""
  lines = [
      "| attention | h_k | h | h_v | d_k | d_v | steps | ln(PPL) held-out |"
      " step time (s) | params per att. layer | multiplies per att. layer |",
      "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    hk = "" if r["variant"] == "multi_head" else r["heads_k"]
    hv = "" if r["variant"] == "multi_head" else r["heads_v"]
    lines.append(
        "| %s | %s | %s | %s | %s | %s | %d | %.3f | %.3f | %d | %.3e |" % (
            r["row_label"], hk, r["heads"], hv, r["d_k"], r["d_v"], r["step"],
            r["ln_ppl"], r["step_time"], r["params"], r["multiplies"]))
  return "\n".join(lines)


def plot(results, path):
  """Training-loss curves (and held-out ln(PPL) points) to a PNG."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for r in results:
    steps = [row["step"] for row in r["log"]]
    losses = [row["loss"] for row in r["log"]]
    window = max(1, len(losses) // 50)
    smooth = [sum(losses[max(0, i - window + 1):i + 1]) /
              len(losses[max(0, i - window + 1):i + 1])
              for i in range(len(losses))]
    line, = ax.plot(steps, smooth, label="%s (train loss)" % r["row_label"])
    ax.plot([r["step"]], [r["ln_ppl"]], "o", color=line.get_color(),
            label="%s held-out ln(PPL) %.3f" % (r["row_label"], r["ln_ppl"]))
  ax.set_xlabel("step")
  ax.set_ylabel("nats per token")
  ax.set_title("tiny T5 on the embedded corpus: multi-head vs talking-heads")
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main(argv=None):
  parser = commands.ArgumentParser(prog=PROG,
                                    description=__doc__.splitlines()[0])
  parser.add_argument("--output_dir", default="demo_output")
  parser.add_argument("--train_steps", type=train_command.positive_int,
                      default=200)
  parser.add_argument("--mesh_shape", default="model:4",
                      help="mesh of logical CPU devices (heads:model)")
  parser.add_argument("--fresh", action="store_true",
                      help="delete output_dir first")
  parser.add_argument("--verbose", action="store_true")
  argv = sys.argv[1:] if argv is None else argv

  def body(args, training):
    from mtf_talking_heads import costs  # pylint: disable=g-import-not-at-top
    from mtf_talking_heads import models  # pylint: disable=g-import-not-at-top
    from mtf_talking_heads import progress  # pylint: disable=g-import-not-at-top
    start = time.time()
    if args.fresh and os.path.isdir(args.output_dir):
      shutil.rmtree(args.output_dir)
    os.makedirs(args.output_dir, exist_ok=True)
    params = ["mesh_shape = %r" % args.mesh_shape,
              "layout = 'heads:model,d_ff:model,vocab:model'",
              "save_checkpoints_steps = %d" % args.train_steps,
              "mtf_th.train_model.print_every_secs = 15"]
    results = []
    for name, experiment in ROWS:
      gin_files = [experiment, SCALE]
      model_dir = os.path.join(args.output_dir, name)
      info = row_costs(training, models, costs, gin_files, params)
      print("[demo] training %s (%s) for %d steps on mesh %s -> %s"
            % (info["row_label"], experiment, args.train_steps,
               args.mesh_shape, model_dir), file=sys.stderr, flush=True)
      log = training.train(model_dir, gin_files, params,
                           train_steps=args.train_steps)
      evals = training.evaluate(model_dir, gin_files, params)
      info.update(log=log, step=evals[-1]["step"],
                  ln_ppl=evals[-1]["ln_ppl"], step_time=step_seconds(log))
      results.append(info)
    table = format_table(results)
    png = os.path.join(args.output_dir, "loss_curves.png")
    plot(results, png)
    elapsed = time.time() - start
    text = ("%s\n\nmesh %s (heads:model) on logical CPU devices; tiny T5: "
            "d_model %d, 2+2 layers, inputs %d tokens, batch 8; held-out "
            "ln(PPL) = mean token cross-entropy (nats) on the validation "
            "split.\nwall time %.0f s; loss curves: %s\n"
            % (table, args.mesh_shape, results[0]["d_model"],
               results[0]["inputs_length"], elapsed, png))
    with open(os.path.join(args.output_dir, "results.md"), "w") as f:
      f.write(text)
    del progress
    print(text)
    return 0

  return train_command.run_command(PROG, parser, argv, body)


if __name__ == "__main__":
  sys.exit(main())
