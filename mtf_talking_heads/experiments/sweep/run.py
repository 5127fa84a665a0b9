"""Running a sweep: every unfinished run, each in its own processes.

Owns Runner (the manifest check that lets a sweep resume, the execution of
one run's `mtf_th train` / `mtf_th eval` commands, the results.csv line it
appends, progress lines with an ETA) and the time accounting of a run over
its interrupted pieces (RUN_TIME in the run directory).
"""
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time

from mtf_talking_heads.experiments import comparison
from mtf_talking_heads.experiments.sweep import plan as plan_lib
from mtf_talking_heads.experiments.sweep import report
from mtf_talking_heads.experiments.sweep import results
from mtf_talking_heads.runtime import cluster
from mtf_talking_heads.runtime import dir_lock
from mtf_talking_heads.runtime import identity
from mtf_talking_heads.runtime import progress
from mtf_talking_heads.runtime import run_files

RUN_TIME = "sweep_time.json"
POLL_SECS = 2
PROGRESS_EVERY_SECS = 60
# a stopped run ends within runtime/stops.SAVE_WAIT_SECS (8 s) even inside
# TensorFlow; SIGKILL after this, so the sweep too ends within 10 s
INTERRUPT_GRACE_SECS = 9


def default_launcher():
  """The argv prefix that runs `mtf_th` with this Python, as the console
  script does (a light import: its stop handlers come before TensorFlow)."""
  return [sys.executable, "-m", "mtf_talking_heads_startup"]


def _failure_line(log_path):
  """What a failed command said: its last `mtf_th ...: error:` line (every
  command ends with one), else the log's last non-empty line."""
  with open(log_path, errors="replace") as log:
    lines = [l.strip() for l in log if l.strip() and not l.startswith("# ")]
  errors = [l for l in lines if l.startswith("mtf_th ") and ": error: " in l]
  if errors:
    return errors[-1]
  return lines[-1] if lines else "it printed nothing"


def _stop_with_this_process():
  """In a run's command before exec: SIGTERM's default action back (a
  sweep started with SIGTERM ignored would pass that on, and then nothing
  could stop the run cleanly), and SIGTERM when the sweep dies without
  passing a stop on (SIGKILL), so no run trains on unwatched."""
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  cluster.die_with_parent(signal.SIGTERM)


class Runner(object):
  """Trains and evaluates the runs of a Plan that results.csv lacks.

  Example:
    runner = Runner(plan, report.Reporter(plan))
    runner.run()  # runs/<row>/seed_<n>/, results.csv, results.md, plots

  Args:
    plan: the Plan (rows, seeds, commands, output_dir).
    reporter: the report.Reporter that rewrites tables and plots.
    launcher: argv prefix that runs `mtf_th` (default: this Python).
    log: where progress lines go (default sys.stdout).
  """

  def __init__(self, plan, reporter, launcher=None, log=None):
    self.plan = plan
    self.reporter = reporter
    self.launcher = list(launcher or default_launcher())
    self.log = log or sys.stdout

  def manifest_conflict(self):
    """Refuses an output_dir of another sweep; writes nothing.

    Returns:
      the recorded manifest (None for a new output_dir).
    Raises:
      ValueError: output_dir holds a sweep with other settings (more rows
        are allowed: the sweep grows, recorded runs stay).
    """
    output_dir = self.plan.output_dir
    path = os.path.join(output_dir, plan_lib.MANIFEST)
    if not os.path.exists(path):
      return None
    mine = self.plan.manifest()
    with open(path) as f:
      theirs = json.load(f)
    different = sorted(k for k in mine if mine[k] != theirs.get(k)
                       and not (k == "finetune" and k not in theirs))
    if different == ["rows"] and all(r in mine["rows"]
                                     for r in theirs["rows"]):
      different = []  # more rows: the sweep grows, recorded runs stay
    if different:
      raise ValueError(
          "output_dir=%r holds a sweep with other settings (%s differ; "
          "see %s); use a new --output_dir, or the same settings to resume "
          "(adding rows is allowed)"
          % (output_dir, ", ".join(different), path))
    return theirs

  def model_conflict(self):
    """Refuses a run folder that holds another model than its row's gin
    files make now (runtime/identity.refusal: e.g. a row's gin file edited
    since the run was trained, or sweep.json deleted); writes nothing.

    Raises:
      ValueError: one line naming the run folder and the difference.
    """
    stage = self.plan.finetune
    for run in self.plan.runs():
      folders = [(run.model_dir, list(self.plan.row_files(run.row)),
                  list(self.plan.row_params(run.row, run.seed)))]
      if stage:
        folders.append((stage.model_dir(run.row, run.seed),)
                       + tuple(stage.gin(run.row, run.seed)))
      for model_dir, files, params in folders:
        message = identity.refusal(model_dir, files, params, "run folder",
                                   "sweep")
        if message:
          raise ValueError(message)

  def records_conflict(self):
    """Refuses results.csv lines measured at other steps, edited or cut,
    and run folders trained to other train_steps (results.check_records:
    e.g. sweep.json deleted and the sweep rerun with other --train_steps
    or --eval_steps); writes nothing.

    Raises:
      ValueError: one line naming the file, the line and what to do.
    """
    plan = self.plan
    results.check_records(
        plan.output_dir, [(r.row.name, r.seed, r.model_dir)
                          for r in plan.runs()],
        plan.eval_steps, plan.train_steps)

  def check_manifest(self):
    """Records the plan's manifest, or refuses an output_dir of another sweep.

    Raises:
      ValueError: see manifest_conflict.
    """
    output_dir = self.plan.output_dir
    path = os.path.join(output_dir, plan_lib.MANIFEST)
    mine = self.plan.manifest()
    theirs = self.manifest_conflict()
    if theirs is not None:
      if mine["rows"] != theirs["rows"] or ("finetune" in mine
                                           and "finetune" not in theirs):
        with open(path, "w") as f:
          json.dump(mine, f, indent=1)
    else:
      os.makedirs(output_dir, exist_ok=True)
      with open(path, "w") as f:
        json.dump(mine, f, indent=1)

  def say(self, text):
    self.log.write(text + "\n")
    self.log.flush()

  def execute(self, run):
    """Runs one row x seed; returns its record.

    A run stopped in flight (killed, machine stopped) continues from its
    last checkpoint: `mtf_th train` resumes and skips the batches it has
    seen, so the run follows the same curve as an uninterrupted one.  Wall
    and CPU seconds add up over the pieces (RUN_TIME in the run directory).
    """
    busy = dir_lock.refusal(run.model_dir, "--model_dir")
    if busy:  # e.g. a `mtf_th train` started by hand into this run
      raise ValueError(busy)
    if os.path.isdir(run.model_dir) and not run_files.checkpoint_prefixes(
        run.model_dir):
      shutil.rmtree(run.model_dir)  # nothing to resume from (e.g. only the
      # small files a commit carried to another machine): start over
    os.makedirs(run.model_dir, exist_ok=True)
    self._call(run, run.commands, run.model_dir, self.plan.train_steps)
    return self._record(run)

  def _call(self, run, commands, model_dir, last_step):
    """Runs the argv lists in order in child processes, logged to
    <model_dir>/sweep.log, their time added to model_dir's RUN_TIME;
    progress lines count towards step `last_step`.

    Raises:
      RuntimeError: a command failed (its log's last lines).
    """
    os.makedirs(model_dir, exist_ok=True)
    log_path = os.path.join(model_dir, "sweep.log")
    spent = read_run_time(model_dir)
    start = time.time()
    cpu_start = _children_cpu_seconds()
    for argv in commands:
      argv = self.launcher + argv[1:]
      with open(log_path, "a") as log:
        log.write("$ %s\n" % " ".join(shlex.quote(a) for a in argv))
        log.flush()
        began = time.time()
        try:  # an interrupted piece's time counts too (Ctrl-C, SIGTERM)
          # a process group of its own: a terminal's Ctrl-C reaches the
          # sweep only, which passes it on once, as SIGTERM
          proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                  process_group=0,
                                  preexec_fn=_stop_with_this_process)
          code = self._watch(proc, run, model_dir, log, last_step)
        finally:
          write_run_time(model_dir, spent, time.time() - start,
                         _children_cpu_seconds() - cpu_start)
        log.write("# exit status %d after %.1f s\n" % (code,
                                                      time.time() - began))
      if code != 0:
        raise RuntimeError(
            "run %s seed %d failed (exit status %d) in `%s`: %s (log %s); "
            "rerun the sweep to resume" % (
                run.row.name, run.seed, code,
                " ".join(argv[:len(self.launcher) + 1]),
                _failure_line(log_path), log_path))

  def _watch(self, proc, run, model_dir, log, last_step):
    """Waits for a run's command; returns its exit status.

    Says a line for every new evaluation in the run's eval_results.csv and,
    while it trains, one every PROGRESS_EVERY_SECS with its step, loss,
    steps/s and its own ETA (its steps left to `last_step` at its recent
    rate: the pre-training's train_steps, or a fine-tuning's last step).  On
    KeyboardInterrupt (Ctrl-C, or SIGTERM under `mtf_th`) the command gets
    SIGTERM (it saves nothing half-written and exits; its SIGINT may be
    ignored, as in a background sweep) and, if it has not exited after
    INTERRUPT_GRACE_SECS, SIGKILL; the run's `log` gets a line saying
    which, with the command's exit status.  The command also gets SIGTERM
    if the sweep dies first (SIGKILL).
    """
    seen = set(run_files.scan_eval_results(model_dir))
    last = time.time()
    try:
      while True:
        try:
          return proc.wait(timeout=POLL_SECS)
        except subprocess.TimeoutExpired:
          pass
        evals = run_files.scan_eval_results(model_dir)
        for step in sorted(set(evals) - seen):
          self.say("    %s seed %d: ln(PPL) %.4f at step %d%s"
                   % (run.row.name, run.seed, evals[step], step,
                      self._run_eta(model_dir, last_step)))
          last = time.time()
        seen = set(evals)
        if time.time() - last >= PROGRESS_EVERY_SECS:
          line = _train_progress(model_dir, last_step)
          if line:
            self.say("    %s seed %d: %s" % (run.row.name, run.seed, line))
          last = time.time()
    except KeyboardInterrupt:
      how = "had exited"
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # its SIGINT may be ignored
        how = "was sent SIGTERM"
        try:
          proc.wait(timeout=INTERRUPT_GRACE_SECS)
        except subprocess.TimeoutExpired:
          proc.kill()
          proc.wait()
          how = "was SIGKILLed: still running %d s after SIGTERM" % (
              INTERRUPT_GRACE_SECS)
      log.write("# interrupted: the command %s; exit status %d\n"
                % (how, proc.returncode))
      raise

  def _run_eta(self, model_dir, last_step):
    line = _train_progress(model_dir, last_step)
    return "; " + line if line else ""

  def finetune(self, run):
    """The fine-tuning stage of a pre-trained run, resumably; its cells.

    Skips what is finished: scored at the final fine-tuning step -> nothing
    runs; fine-tuned to it -> only `mtf_th eval --metrics`; otherwise
    `mtf_th finetune` (which resumes from its last checkpoint) and then the
    metrics.  Time goes to <run>/finetune/sweep_time.json.
    """
    stage = self.plan.finetune
    state = stage.stage_state(run.row, run.seed)
    commands = stage.commands(run.row, run.seed)
    todo = {"done": [], "finetuned": commands[1:], "todo": commands}[state]
    if todo:
      self._call(run, todo, stage.model_dir(run.row, run.seed),
                 stage.total_steps)
    return stage.record(run.row, run.seed)

  def _record(self, run):
    """The results.csv line of a finished run, from the files it wrote."""
    eval_steps = self.plan.eval_steps
    wall, cpu = read_run_time(run.model_dir)
    record = self.plan.row_record(run.row, run.seed)
    evals = results.read_eval_results(run.model_dir)
    for key, step in (("early_ln_ppl", eval_steps[0]),
                      ("final_ln_ppl", eval_steps[-1])):
      if step not in evals:
        raise RuntimeError(
            "run %s seed %d: %s has no ln_ppl at step %d (has %s)"
            % (run.row.name, run.seed, os.path.join(
                run.model_dir, run_files.EVAL_RESULTS), step,
               sorted(evals)))
      record[key] = evals[step]
    record["step_time_sec"] = comparison.median_step_time(run.model_dir)
    record["wall_sec"] = round(wall, 1)
    record["cpu_sec"] = round(cpu, 1)
    return record

  def run(self, train=True):
    """Trains and evaluates every unfinished run; writes results and plots.

    Args:
      train: False: only rewrite the tables and plots from the recorded
        runs (the output_dir must hold this sweep).
    Returns:
      the summary rows (report.summarize()) of all recorded runs.
    """
    plan = self.plan
    if not train:
      if not os.path.exists(os.path.join(plan.output_dir, plan_lib.MANIFEST)):
        raise ValueError("output_dir=%r holds no sweep to report on"
                         % plan.output_dir)
      self.records_conflict()
      return self._run(train)
    self.manifest_conflict()
    self.model_conflict()
    self.records_conflict()
    os.makedirs(plan.output_dir, exist_ok=True)
    with dir_lock.hold(plan.output_dir, "--output_dir", self.log):
      return self._run(train)

  def _run(self, train):
    plan = self.plan
    self.check_manifest()
    runs = plan.runs()
    done = results.read_results(plan.output_dir)
    if plan.finetune and train:
      done = self._requeue(runs, done)
    todo = [r for r in runs if (r.row.name, r.seed) not in done]
    self.say("sweep %s (%s scale, %d rows x %d seeds, %d steps, ln(PPL) at "
             "%s): %d runs, %d already recorded"
             % (plan.table, plan.scale, len(plan.rows), plan.seeds,
                plan.train_steps, ",".join(map(str, plan.eval_steps)),
                len(runs), len(runs) - len(todo)))
    if not train:
      todo = []
    walls = []
    for i, run in enumerate(todo):
      record = self.execute(run)
      results.append_result(plan.output_dir, record)
      walls.append(record["wall_sec"])
      eta = (len(todo) - i - 1) * sum(walls) / len(walls)
      self.say("[%d/%d] %s seed %d: ln(PPL) %.4f @%d, %.4f @%d; step %.4f "
               "s; %.0f s (%.0f s CPU); ETA %s"
               % (len(runs) - len(todo) + i + 1, len(runs), run.row.name,
                  run.seed, record["early_ln_ppl"], plan.eval_steps[0],
                  record["final_ln_ppl"], plan.eval_steps[-1],
                  record["step_time_sec"], record["wall_sec"],
                  record["cpu_sec"], progress.format_seconds(eta)))
      self.reporter.write_table()
      if plan.finetune:
        self._finetune_and_record(run)
    if plan.finetune and train:
      for run in runs:
        if not done.get((run.row.name, run.seed), {}).get("finetune_step"):
          if run not in todo:
            self._finetune_and_record(run)
    self.reporter.write_table()
    self.reporter.write_plots()
    self.say("wrote %s" % ", ".join(
        os.path.join(plan.output_dir, f)
        for f in (results.RESULTS_CSV, report.RESULTS_MD,
                  comparison.COMPARISON_MD)
        + report.PLOTS + (report.CURVES_PLOT,)))
    return self.reporter.summary()


  def _requeue(self, runs, done):
    """Puts back in the to-do list each recorded run whose fine-tuning
    cannot start (Finetune.cannot_start: not fine-tuned, and the
    pre-training checkpoint it starts from is gone, e.g. on another
    machine); says so.  Its results.csv line and any finetune/ directory
    are dropped (execute() starts it over and records it anew).

    Returns:
      results.csv's records after the drops ({(row name, seed): record}).
    """
    stage = self.plan.finetune
    lost = [r for r in runs if (r.row.name, r.seed) in done
            and not done[(r.row.name, r.seed)].get("finetune_step")
            and stage.cannot_start(r.row, r.seed)]
    for run in lost:
      busy = dir_lock.refusal(stage.model_dir(run.row, run.seed),
                              "--model_dir")
      if busy:  # e.g. a `mtf_th finetune` started by hand into this run
        raise ValueError(busy)
      self.say("%s seed %d: pre-training is recorded but not its "
               "fine-tuning, and the checkpoint fine-tuning starts from "
               "(step %d in %s) is gone: the run is trained again"
               % (run.row.name, run.seed, self.plan.train_steps,
                  run.model_dir))
      shutil.rmtree(stage.model_dir(run.row, run.seed), ignore_errors=True)
      results.remove_result(self.plan.output_dir, run.row.name, run.seed)
    return results.read_results(self.plan.output_dir) if lost else done

  def _finetune_and_record(self, run):
    """Fine-tunes and scores one run; fills its results.csv cells."""
    cells = self.finetune(run)
    results.update_result(self.plan.output_dir, run.row.name, run.seed, cells)
    self.say("    %s seed %d fine-tuned to step %d on %s: span F1 %s, "
             "classification accuracy %s"
             % (run.row.name, run.seed, cells["finetune_step"],
                cells["downstream_mixture"], _cell(cells["span_f1"]),
                _cell(cells["cls_accuracy"])))
    self.reporter.write_table()


def _train_progress(model_dir, train_steps, window=50):
  """"step S/N, loss L, R steps/s; ETA T for this run" from train_log.csv
  (the rate over its last `window` rows; None before the first row)."""
  rows = [(r["step"], r["loss"], r["elapsed_sec"])
          for r in run_files.scan_train_log(model_dir)
          if None not in (r["step"], r["loss"], r["elapsed_sec"])]
  if not rows:
    return None
  step, loss, elapsed = rows[-1]
  first = rows[max(0, len(rows) - window)]
  rate = ((step - first[0]) / (elapsed - first[2])
          if elapsed > first[2] else None)
  text = "step %d/%d, loss %.4f" % (step, train_steps, loss)
  if rate:
    text += ", %.2f steps/s; ETA %s for this run's training" % (
        rate, progress.format_seconds((train_steps - step) / rate))
  return text


def _cell(value):
  return "-" if value is None else "%.2f" % value


def read_run_time(model_dir):
  """(wall, cpu) seconds the sweep has spent on a run so far."""
  path = os.path.join(model_dir, RUN_TIME)
  if not os.path.exists(path):
    return 0.0, 0.0
  with open(path) as f:
    data = json.load(f)
  return float(data["wall_sec"]), float(data["cpu_sec"])


def write_run_time(model_dir, spent, wall, cpu):
  """Records spent + (wall, cpu) of this invocation (atomic rename)."""
  path = os.path.join(model_dir, RUN_TIME)
  with open(path + ".tmp", "w") as f:
    json.dump({"wall_sec": spent[0] + wall, "cpu_sec": spent[1] + cpu}, f)
  os.replace(path + ".tmp", path)


def _children_cpu_seconds():
  """User + system CPU seconds of this process's finished child processes."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime
