"""Every shell command shown in README.md and docs/*.md works.

Which text is a command: tests/_doc_commands.py.

How a command is checked (test_doc_command: in this process, no training)
  * mtf_th: parsed as written by the subcommand's own argparse parser
    (captured from its main()).  Then train: every --gin_file exists and
    `training.parse_gin` + `training.preflight` accept the files and
    params (what `mtf_th train` checks before it builds a graph); finetune:
    parse_gin (its pre-flight reads the paper mixture's vocabulary, a
    download); eval: --checkpoint_steps; sweep: run as written with
    --dry_run added (prints the plan and runs the pre-flight of every row),
    --list_paper_tables runs, and --report runs for real on a copy of the
    committed records of its --output_dir and must rewrite results.md and
    comparison.md exactly as committed; --scaling runs for real on copies
    of the committed sweeps (and must rewrite a committed scaling.md
    exactly) or, while one of them is not committed yet, must refuse it
    (status 2); costs and perf (pure Python): run,
    and print what the doc shows after a `$ ` prompt.  comm, visualize,
    decode, demo: parsed (the slow tests run comm and visualize).
  * t5_mesh_transformer: the console script exists, every flag is one of
    its absl flags, and its gin files and params pass parse_gin +
    preflight.
  * make TARGET: `make -n TARGET` succeeds and every `mtf_th` command it
    would run parses.
  * python -m MODULE / python SCRIPT / launch/tpu.py: parsed by the
    module's or script's own parser; with --dry_run (launch/tpu.py) run.
    .venv/bin/pytest FILE: the file exists.  launch/*.sh: executable.

Run for real (slow tests, as written after SUBSTITUTIONS, in a fresh
directory so that relative output paths such as runs/ and pictures/ land
there): the quick start of docs/training.md (train -> eval
--checkpoint_steps=all -> decode) and then `mtf_th visualize` on the model
it trained, the four one after another in one subprocess (_run_batch: each
as its console script runs it, with its own stdout and stderr); `mtf_th
comm` in a subprocess (its table must equal the doc's; in this process the
configs parsed by the checks above would change its graphs); the
vocabulary builder's main() in this process; every `python -c` in a
subprocess.  Programs are taken from this interpreter's bin directory
(`.venv/bin/` under `make test`).
"""
import argparse
import collections
import csv
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from mtf_talking_heads import cli
from mtf_talking_heads import commands
from _cli_util import REPO
from _doc_commands import BIN, COMMANDS, IGNORED_PROGRAMS, PLACEHOLDER
from _doc_commands import PURE_PYTHON, SUBSTITUTIONS
from _doc_commands import doc_commands, program_name, shell_words

# ------------------------------------------------------------ parsers, runs
class _Captured(Exception):
  def __init__(self, parser):
    super().__init__()
    self.parser = parser


def _capture_parser(main, *args):
  """The argparse parser `main` builds (it is stopped at parse_args)."""
  original = argparse.ArgumentParser.parse_args

  def capture(self, args=None, namespace=None):
    raise _Captured(self)

  argparse.ArgumentParser.parse_args = capture
  try:
    main(*args)
  except _Captured as c:
    return c.parser
  finally:
    argparse.ArgumentParser.parse_args = original
  raise AssertionError("%r parsed no command line" % (main,))


def _load_script(path):
  name = "doc_script_" + re.sub(r"\W", "_", path)
  spec = importlib.util.spec_from_file_location(name,
                                                os.path.join(REPO, path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _subcommand_main(sub):
  return importlib.import_module(cli.COMMANDS[sub]).main


def _parse(cmd, parser, argv):
  """parser's namespace for argv, or a test failure naming the doc line."""
  try:
    return parser.parse_args(argv)
  except (SystemExit, commands.UsageError) as e:
    pytest.fail("%s\n  does not parse (%s: %s)" % (cmd, type(e).__name__, e))


def _check_flag_names(cmd, parser, tokens):
  """Every --flag of tokens is an option of parser (names-only check)."""
  for token in tokens:
    token = token.strip("[]")
    if token.startswith("--"):
      flag = token.split("=")[0]
      assert flag in parser._option_string_actions, (  # pylint: disable=protected-access
          "%s\n  %s is not an option of %s" % (cmd, flag, parser.prog))


def _values(tokens, flag):
  """The values of --flag X / --flag=X in tokens."""
  out = []
  for i, token in enumerate(tokens):
    if token == flag and i + 1 < len(tokens):
      out.append(tokens[i + 1])
    elif token.startswith(flag + "="):
      out.append(token.split("=", 1)[1])
  return out


def _check_names(cmd, parser):
  """Flags, --paper_table and --gin_file values of cmd name real things."""
  tokens = cmd.raw_argv
  _check_flag_names(cmd, parser, tokens)
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.experiments import sweep  # pylint: disable=g-import-not-at-top
  for table in _values(tokens, "--paper_table"):
    if re.match(r"^[a-z0-9_]+$", table):
      assert table in sweep.paper_table_names(), (
          "%s\n  --paper_table %s is not a table" % (cmd, table))
  for gin_file in _values(tokens, "--gin_file"):
    if not PLACEHOLDER.search(gin_file):
      try:
        training.resolve_gin_file(gin_file)
      except training.ConfigError as e:
        pytest.fail("%s\n  %s" % (cmd, e))


def _gin_check(cmd, files, params, preflight=True, tpu=None):
  """What `mtf_th train` checks before building a graph."""
  from mtf_talking_heads import training  # pylint: disable=g-import-not-at-top
  try:
    training.parse_gin(files, params)
    if preflight:
      training.preflight(tpu=tpu)
  except training.ConfigError as e:
    pytest.fail("%s\n  fails the pre-flight of mtf_th train: %s" % (cmd, e))


def _committed_records(src, dst):
  """Copies what git keeps of a sweep directory (see .gitignore)."""
  for root, _, files in os.walk(src):
    rel = os.path.relpath(root, src)
    in_runs = rel.split(os.sep)[0] == "runs"
    for name in files:
      if in_runs and not (name.endswith(".csv") or
                          name in ("sweep_time.json", "sweep.log")):
        continue
      os.makedirs(os.path.join(dst, rel), exist_ok=True)
      shutil.copy(os.path.join(root, name), os.path.join(dst, rel, name))


def _run_in_process(argv, capsys):
  """(status, stdout, stderr) of `mtf_th argv` in this process."""
  status = cli.main(argv)
  out = capsys.readouterr()
  return status, out.out, out.err


def _check_scaling(cmd, args, argv, capsys, tmp_path):
  """`mtf_th sweep --scaling DIR ...` on copies of the committed records.

  When every DIR is committed it must run and, if OUTPUT_DIR/scaling.md is
  committed too, rewrite it exactly; until then (the sweeps of a scaling
  curve take sessions) it must refuse, in one line with status 2, the
  first DIR not committed, or a committed one with a row not run yet.
  """
  missing = [d for d in args.scaling
             if not os.path.exists(os.path.join(REPO, d, "sweep.json"))]
  for d in args.scaling:
    if d not in missing:
      _committed_records(os.path.join(REPO, d), os.path.join(tmp_path, d))
  status, _, err = _run_in_process(["sweep"] + argv, capsys)
  if missing:
    assert (status, err) == (2, "mtf_th sweep: error: --scaling %s is not a "
                             "directory: give the --output_dir of a recorded "
                             "`mtf_th sweep`\n" % missing[0]), (cmd, err)
    return
  if status == 2 and re.fullmatch(r"mtf_th sweep: error: --scaling \S+: row "
                                  r"\S+ has no finished run in results.csv "
                                  r"yet\n", err):
    return  # a sweep in progress
  assert status == 0, "%s\n  %s" % (cmd, err)
  committed = os.path.join(REPO, args.output_dir, "scaling.md")
  if os.path.exists(committed):
    with open(committed) as f, open(os.path.join(
        tmp_path, args.output_dir, "scaling.md")) as g:
      assert g.read() == f.read(), (
          "%s\n  rewrote scaling.md differently from the committed one" % cmd)


def _check_sweep(cmd, args, argv, capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  if args.scaling:
    _check_scaling(cmd, args, argv, capsys, tmp_path)
    return
  if args.list_paper_tables:
    from mtf_talking_heads.experiments import sweep  # pylint: disable=g-import-not-at-top
    status, out, err = _run_in_process(["sweep"] + argv, capsys)
    assert status == 0, "%s\n  %s" % (cmd, err)
    assert out.split() == list(sweep.paper_table_names()), cmd
    return
  if args.report:
    source = os.path.join(REPO, args.output_dir)
    assert os.path.exists(os.path.join(source, "sweep.json")), (
        "%s\n  --report needs the recorded sweep %s" % (cmd, source))
    _committed_records(source, os.path.join(tmp_path, args.output_dir))
    status, _, err = _run_in_process(["sweep"] + argv, capsys)
    assert status == 0, "%s\n  %s" % (cmd, err)
    for name in ("results.md", "comparison.md"):
      with open(os.path.join(source, name)) as f:
        expected = f.read()
      with open(os.path.join(tmp_path, args.output_dir, name)) as f:
        assert f.read() == expected, (
            "%s\n  rewrote %s differently from the committed one"
            % (cmd, name))
    return
  dry = argv if args.dry_run else argv + ["--dry_run"]
  status, out, err = _run_in_process(["sweep"] + dry, capsys)
  assert status == 0, "%s\n  --dry_run failed:\n%s" % (cmd, err[-3000:])
  assert "pre-flight of `mtf_th train` passed" in err, (cmd, err[-2000:])
  assert out.strip(), cmd


def _check_mtf_th(cmd, argv, capsys, tmp_path, monkeypatch):
  """An `mtf_th ...` command (argv without the program)."""
  if argv[0] in ("--help", "-h"):
    assert cli.main(argv) == 0, cmd
    assert "usage: mtf_th" in capsys.readouterr().out
    return
  subs = re.split(r"[|/]", argv[0])
  for sub in subs:
    assert sub in cli.COMMANDS, "%s\n  unknown mtf_th command %r" % (cmd, sub)
  parsers = {sub: _capture_parser(_subcommand_main(sub), []) for sub in subs}
  if cmd.inline or cmd.placeholders or len(subs) > 1:
    for parser in parsers.values():
      _check_names(cmd, parser)
    return
  sub = subs[0]
  _check_names(cmd, parsers[sub])
  args = _parse(cmd, parsers[sub], argv[1:])
  _check_parsed(cmd, sub, args, argv, capsys, tmp_path, monkeypatch)


def _check_parsed(cmd, sub, args, argv, capsys, tmp_path, monkeypatch):
  """The checks of a parsed `mtf_th sub ...` beyond its parser's."""
  if sub == "train":
    extra = (["utils.run.train_steps = %d" % args.train_steps]
             if args.train_steps else [])
    _gin_check(cmd, args.gin_file, args.gin_param + extra, tpu=args.tpu)
  elif sub == "finetune":
    _gin_check(cmd, args.gin_file, args.gin_param, preflight=False)
  elif sub in ("eval", "decode") and args.gin_file:
    _gin_check(cmd, args.gin_file, args.gin_param, tpu=args.tpu)
  if sub == "eval":
    from mtf_talking_heads.commands import evaluate  # pylint: disable=g-import-not-at-top
    try:
      evaluate.parse_steps(args.checkpoint_steps)
    except commands.UsageError as e:
      pytest.fail("%s\n  %s" % (cmd, e))
  elif sub == "sweep":
    _check_sweep(cmd, args, argv[1:], capsys, tmp_path, monkeypatch)
  elif sub in PURE_PYTHON:
    status, out, err = _run_in_process(argv, capsys)
    assert status == 0, "%s\n  %s" % (cmd, err)
    if cmd.output:
      assert out.strip().splitlines() == cmd.output, (
          "%s\n  prints\n%s\n  but the doc shows\n%s"
          % (cmd, out, "\n".join(cmd.output)))


def _check_t5(cmd, argv):
  """t5's own script: the flags exist, the gin passes the pre-flight."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from t5.models import mesh_transformer_main  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  assert os.access(os.path.join(BIN, "t5_mesh_transformer"), os.X_OK), cmd
  files, params = [], []
  for token in argv:
    assert token.startswith("--"), "%s\n  stray argument %r" % (cmd, token)
    name, _, value = token[2:].partition("=")
    assert name in flags.FLAGS, "%s\n  --%s is not a flag of t5" % (cmd, name)
    if name == "module_import":
      importlib.import_module(value)
    elif name == "gin_file":
      files.append(value)
    elif name == "gin_param":
      params.append(value)
  if not (cmd.inline or cmd.placeholders):
    _gin_check(cmd, files, params)


def _check_make(cmd, argv, capsys, tmp_path, monkeypatch):
  targets = [t for t in argv if not t.startswith("-") and "=" not in t]
  proc = subprocess.run(["make", "-n"] + argv, cwd=REPO, capture_output=True,
                        text=True, timeout=60)
  assert proc.returncode == 0, "%s\n  make -n: %s" % (cmd, proc.stderr)
  for line in proc.stdout.splitlines():
    tokens = shell_words(line)
    if tokens and tokens[0].endswith("/mtf_th"):
      inner = dataclasses.replace(cmd, argv=tokens, raw_argv=tokens,
                                  text="%s  (make %s runs: %s)"
                                  % (cmd.text, " ".join(targets), line))
      _check_mtf_th(inner, tokens[1:], capsys, tmp_path, monkeypatch)


def _check_python(cmd, argv, capsys):
  """python -m MODULE / python -c CODE / python SCRIPT (argv after python)."""
  if argv[0] == "-c":
    assert len(argv) == 2, "%s\n  python -c takes one argument" % cmd
    return  # run by test_python_c_commands
  while argv and argv[0] in ("-I", "-S", "-u", "-B", "-E", "-s"):
    argv = argv[1:]  # the interpreter's own options
  if not argv:
    return
  if argv[0] == "-m":
    main, rest = importlib.import_module(argv[1]).main, argv[2:]
    parser = _capture_parser(main, [])
  else:
    assert os.path.exists(os.path.join(REPO, argv[0])), (
        "%s\n  no such script %s" % (cmd, argv[0]))
    _check_script(cmd, argv[0], argv[1:], capsys)
    return
  if cmd.inline or cmd.placeholders:
    _check_flag_names(cmd, parser, cmd.raw_argv)
  else:
    _parse(cmd, parser, rest)


def _check_script(cmd, path, argv, capsys):
  if path.endswith(".sh"):
    assert os.access(os.path.join(REPO, path), os.X_OK), (
        "%s\n  %s is not executable" % (cmd, path))
    return
  module = _load_script(path)
  parser = _capture_parser(module.main, [])
  if cmd.inline or cmd.placeholders:
    _check_flag_names(cmd, parser, cmd.raw_argv)
    return
  _parse(cmd, parser, argv)
  if "--dry_run" in argv:
    status = module.main(argv)
    err = capsys.readouterr().err
    assert status == 0, "%s\n  %s" % (cmd, err)


# --------------------------------------------------------------------- tests
def test_every_doc_has_commands_found():
  """The extraction finds the commands this suite relies on."""
  where = {(c.path, c.argv[0].split("/")[-1]) for c in COMMANDS}
  for expected in [("README.md", "make"), ("docs/training.md", "mtf_th"),
                   ("docs/training.md", "t5_mesh_transformer"),
                   ("docs/costs.md", "mtf_th"), ("docs/sweeps.md", "mtf_th"),
                   ("docs/sharding.md", "mtf_th"), ("docs/tpu.md", "python"),
                   ("docs/data.md", "python")]:
    assert expected in where, expected
  assert len(COMMANDS) > 40, len(COMMANDS)


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.where for c in COMMANDS])
def test_doc_command(cmd, capsys, tmp_path, monkeypatch):
  """Parses / pre-flights / dry-runs one command (see the module doc)."""
  check_command(cmd, capsys, tmp_path, monkeypatch)


_BROKEN_DOC = """# Broken commands (each must fail with its line)

```
mtf_th train --model_dir x --no_such_flag 1
mtf_th train --model_dir x --gin_file experiments/t5_heads/no_such_row.gin
mtf_th train --model_dir x --gin_file experiments/t5_heads/07_talking_heads_24_32.gin \\
    --gin_file models/t5_tiny.gin --gin_param "hedas = 3"
mtf_th sweep --paper_table t5_hedas --output_dir x
frobnicate --fast
.venv/bin/python launch/tpu.py --dry_run --name a --zone z --project p \\
    --accelerator v3-32 --parallelism model --model_dir gs://b/a \\
    --experiment experiments/t5_heads/07_talking_heads_24_32.gin
```

```
$ mtf_th costs --variant multi_head --heads 8 --d_k 16 --d_v 16 --d_model 128 --length 128
variant,heads_k,heads,heads_v,d_k,d_v,params,multiplies
multi_head,8,8,8,16,16,65536,12
```

Inline: `mtf_th eval --model_dir x --checkpoint_stepz 3`.
"""


def test_a_failing_doc_command_fails_with_its_file_and_line(
    tmp_path, capsys, monkeypatch):
  doc = tmp_path / "broken.md"
  doc.write_text(_BROKEN_DOC)
  broken = doc_commands([str(doc)])
  assert [c.line for c in broken] == [4, 5, 6, 8, 9, 10, 16, 21], broken
  for cmd in broken:
    with pytest.raises((AssertionError, pytest.fail.Exception)) as e:
      check_command(cmd, capsys, tmp_path, monkeypatch)
    assert "%s:%d" % (doc, cmd.line) in str(e.value), (cmd, e.value)


def check_command(cmd, capsys, tmp_path, monkeypatch):
  """Fails (naming the doc's file and line) unless cmd checks out."""
  argv = cmd.argv
  program = program_name(argv[0])
  if argv[0] in IGNORED_PROGRAMS:
    return
  assert program is not None, (
      "%s\n  unknown program %r in a shell block: add a check for it to "
      "tests/commands/test_docs_commands.py" % (cmd, argv[0]))
  if program == "mtf_th":
    _check_mtf_th(cmd, argv[1:], capsys, tmp_path, monkeypatch)
  elif program == "t5_mesh_transformer":
    _check_t5(cmd, argv[1:])
  elif program == "make":
    _check_make(cmd, argv[1:], capsys, tmp_path, monkeypatch)
  elif program in ("python", "python3"):
    _check_python(cmd, argv[1:], capsys)
  elif program == "pytest":
    for path in argv[1:]:
      if not path.startswith("-"):
        assert os.path.exists(os.path.join(REPO, path.split("::")[0])), cmd
  elif program == "bash":
    _check_script(cmd, argv[1], argv[2:], capsys)
  else:
    _check_script(cmd, argv[0], argv[1:], capsys)


# ----------------------------------------------------- run for real (slow)
def _substituted(cmd):
  text = " ".join(shlex.quote(t) for t in cmd.argv)
  for old, new, _ in SUBSTITUTIONS:
    text = text.replace(old, new)
  argv = shlex.split(text)
  program = argv[0][len(".venv/bin/"):] if argv[0].startswith(
      ".venv/bin/") else argv[0]
  if program in ("python", "python3"):
    return [sys.executable] + argv[1:]
  if program_name(program) == "script":
    return [sys.executable, os.path.join(REPO, program)] + argv[1:]
  return [os.path.join(BIN, program)] + argv[1:]


def _run(cmd, cwd, timeout=900):
  argv = _substituted(cmd)
  proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                        timeout=timeout)
  assert proc.returncode == 0, "%s\n  ran as %s\n  status %d:\n%s" % (
      cmd, argv, proc.returncode, proc.stderr[-3000:])
  return proc


# `mtf_th` commands run one after another in one Python, each as the
# console script runs it (its argv, its working directory), each one's
# stdout and stderr (file descriptors 1 and 2: TensorFlow's C++ lines too)
# in files of its own; "status N" on stdout after each; stops at the first
# failure.  TensorFlow and t5 are imported once for all of them.
_BATCH = r"""
import json, os, sys
from mtf_talking_heads_startup import mtf_th
for argv, cwd, out, err in json.loads(sys.argv[1]):
  os.chdir(cwd)
  saved = os.dup(1), os.dup(2)
  with open(out, "w") as o, open(err, "w") as e:
    os.dup2(o.fileno(), 1)
    os.dup2(e.fileno(), 2)
    sys.argv = argv
    try:
      code = mtf_th()
    except SystemExit as x:
      code = x.code if isinstance(x.code, int) or x.code is None else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(saved[0], 1)
    os.dup2(saved[1], 2)
  print("status %d" % (code or 0), flush=True)
  if code:
    sys.exit(code)
"""

Output = collections.namedtuple("Output", ["stdout", "stderr"])


def _run_batch(cmds, cwd, timeout=1800):
  """[Output of each cmd] of `mtf_th` doc commands run (as _run would,
  after SUBSTITUTIONS) one after another in one process in `cwd`."""
  jobs = []
  for i, cmd in enumerate(cmds):
    argv = _substituted(cmd)
    assert os.path.basename(argv[0]) == "mtf_th", cmd
    jobs.append((["mtf_th"] + argv[1:], cwd,
                 os.path.join(cwd, ".out%d" % i),
                 os.path.join(cwd, ".err%d" % i)))
  proc = subprocess.run([sys.executable, "-c", _BATCH, json.dumps(jobs)],
                        cwd=cwd, capture_output=True, text=True,
                        timeout=timeout)
  outputs = []
  for _, (_, _, out, err) in zip(cmds, jobs):
    if not os.path.exists(err):
      break
    with open(out) as o, open(err) as e:
      outputs.append(Output(o.read(), e.read()))
  statuses = [int(l.split()[1]) for l in proc.stdout.splitlines()
              if l.startswith("status ")]
  for cmd, (argv, _, _, _), output, status in zip(cmds, jobs, outputs,
                                                  statuses + [None]):
    assert status == 0, "%s\n  ran as %s\n  status %s:\n%s%s" % (
        cmd, argv, status, output.stderr[-3000:], proc.stderr[-3000:])
  assert proc.returncode == 0 and len(statuses) == len(cmds), proc.stderr
  for path in [p for job in jobs for p in job[2:]]:
    os.remove(path)
  return outputs


def _first(predicate, what):
  for cmd in COMMANDS:
    if not cmd.inline and predicate(cmd):
      return cmd
  pytest.fail("no doc command %s" % what)


def _is(cmd, sub):
  return program_name(cmd.argv[0]) == "mtf_th" and cmd.argv[1] == sub


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory):
  """docs/training.md's quick start, run in a fresh directory, then the
  docs' `mtf_th visualize` on the model it trained (one process for the
  four commands)."""
  cwd = str(tmp_path_factory.mktemp("quick_start"))
  block = [c for c in COMMANDS if c.path == "docs/training.md" and
           c.heading == "Quick start" and not c.inline and
           program_name(c.argv[0]) == "mtf_th"]
  assert [c.argv[1] for c in block] == ["train", "eval", "decode"], block
  visualize = _first(lambda c: _is(c, "visualize"), "mtf_th visualize")
  cmds = block + [visualize]
  procs = {c.argv[1]: out for c, out in zip(cmds, _run_batch(cmds, cwd))}
  return cwd, block, procs


@pytest.mark.slow
def test_quick_start_trains_evaluates_and_decodes(quick_start):
  cwd, block, procs = quick_start
  model_dir = os.path.join(cwd, "runs", "th24")
  train_line = procs["train"].stdout.strip().splitlines()[-1]
  step, loss = re.match(r"step (\d+) loss ([\d.]+)", train_line).groups()
  assert int(step) == 3, train_line
  assert 0 < float(loss) < math.log(8200), train_line  # below uniform
  rows = list(csv.DictReader(procs["eval"].stdout.strip().splitlines()))
  assert [int(r["step"]) for r in rows] == [0, 3], rows  # every checkpoint
  losses = [float(r["ln_ppl"]) for r in rows]
  assert all(0 < l < 10 for l in losses), rows
  assert losses[1] < losses[0], rows  # 3 steps of training help
  # checkpoint 0 depends only on the seed and the data, not on the CPU's
  # kernels beyond rounding: the documented value holds to 0.01
  documented = float(re.search(
      r"Checkpoint 0: ([\d.]+), the same on every machine to 0\.01",
      " ".join(open(os.path.join(REPO, "docs", "training.md")).read().split())
  ).group(1))
  assert abs(losses[0] - documented) < 0.01, (losses[0], documented)
  assert os.path.exists(os.path.join(model_dir, "eval_results.csv"))
  (line,) = procs["decode"].stdout.strip().splitlines()
  given = [t for t in block[2].argv if t.startswith("--input=")][0][8:]
  source, decoded = line.split("\t")
  assert source == given and decoded.strip(), line
  for name, proc in procs.items():  # README: no TensorFlow start-up noise
    # (TensorFlow is imported by the first, train)
    assert "WARNING:tensorflow" not in proc.stderr, (name, proc.stderr)


@pytest.mark.slow
def test_visualize_on_the_quick_start_model(quick_start):
  cwd, _, procs = quick_start
  cmd = _first(lambda c: _is(c, "visualize"), "mtf_th visualize")
  proc = procs["visualize"]
  output_dir = _values(_substituted(cmd), "--output_dir")[0]
  with open(os.path.join(cwd, output_dir, "projections.csv")) as f:
    rows = list(csv.DictReader(f))
  # tiny T5: 2 encoder + 2 decoder self + 2 enc-dec talking-heads layers
  assert len({r["layer"] for r in rows}) == 6, rows
  assert {r["matrix"] for r in rows} == {"P_l", "P_w", "P_l x P_w"}
  for r in rows:
    assert float(r["abs_det"]) > 0 and float(r["min_singular"]) > 0, r
    assert 0 < float(r["change"]) < 1, r  # 3 steps moved every matrix a bit
  assert os.path.exists(os.path.join(cwd, output_dir, "projections.png"))
  assert "wrote" in proc.stdout


@pytest.mark.slow
def test_comm_prints_the_docs_table(tmp_path):
  cmd = _first(lambda c: _is(c, "comm"), "mtf_th comm")
  assert cmd.output, "%s: the doc shows no table after it" % cmd
  proc = _run(cmd, str(tmp_path))
  assert proc.stdout.strip().splitlines() == cmd.output, (
      "%s\n  prints\n%s\n  but the doc shows\n%s"
      % (cmd, proc.stdout, "\n".join(cmd.output)))


@pytest.mark.slow
def test_vocabulary_builder(tmp_path, capfd, monkeypatch):
  """Runs the module's main() in this process (what `python -m` runs)."""
  cmd = _first(lambda c: c.argv[:3] == ["python", "-m",
                                        "mtf_talking_heads.data.vocab"],
               "python -m mtf_talking_heads.data.vocab")
  from mtf_talking_heads.data import corpus  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.data import vocab  # pylint: disable=g-import-not-at-top
  inputs = [t for t in cmd.argv[3:] if t.endswith(".txt")]
  with open(corpus.default_corpus_paths()["train"], encoding="utf-8") as f:
    text = [next(f) for _ in range(1000)]
  for name in inputs:
    with open(os.path.join(tmp_path, name), "w", encoding="utf-8") as f:
      f.writelines(text)
  argv = _substituted(cmd)
  assert argv[1:3] == ["-m", "mtf_talking_heads.data.vocab"], argv
  monkeypatch.chdir(tmp_path)
  capfd.readouterr()
  assert vocab.main(argv[3:]) == 0, cmd
  out = capfd.readouterr().out
  assert "(300 pieces" in out, out
  assert os.path.getsize(os.path.join(tmp_path, cmd.argv[-1])) > 1000


@pytest.mark.slow
def test_python_c_commands(tmp_path):
  """Each `python -c` of the docs runs (data.md's prints the corpus stats)."""
  found = [c for c in COMMANDS if program_name(c.argv[0]) in ("python", "python3")
           and c.argv[1] == "-c"]
  assert found, "no python -c command in the docs"
  for cmd in found:
    proc = _run(cmd, str(tmp_path))
    assert proc.stdout.strip(), cmd
    if "stats()" in cmd.text:
      stats = json.loads(proc.stdout)
      assert stats["total_bytes"] > 10 ** 6, stats
      assert set(stats["bytes"]) == {"train", "validation"}, stats


def _perf_tables(path):
  """[(command, table lines)] of docs tables introduced by "— `mtf_th perf`"."""
  lines = open(os.path.join(REPO, path)).read().split("\n")
  out = []
  for i, line in enumerate(lines):
    match = re.search(r"— `(mtf_th perf [^`]*)`$", line)
    if match and lines[i + 1] == "" and lines[i + 2].startswith("|"):
      j = i + 2
      while j < len(lines) and lines[j].startswith("|"):
        j += 1
      out.append((match.group(1), lines[i + 2:j]))
  return out


def test_costs_md_perf_tables_are_the_command_output(capsys):
  """Each perf table of docs/costs.md is what its command prints (pure
  Python, no kernels: exact)."""
  from mtf_talking_heads.commands import perf as perf_command  # pylint: disable=g-import-not-at-top
  tables = _perf_tables("docs/costs.md")
  assert len(tables) == 7
  for command, documented in tables:
    capsys.readouterr()
    assert perf_command.main(shlex.split(command)[2:]) == 0
    assert capsys.readouterr().out.rstrip("\n").split("\n") == documented, (
        command)
