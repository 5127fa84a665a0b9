"""docs/sharding.md's `mtf_th comm` tables agree with the formulas.

Every table row printed by an `mtf_th comm` command on the page (the row's
variant, strategy and mesh, the command's dims) is priced with
comm.predict (prices.ring_elements, the formulas Auto ranks by):
on a one-axis mesh nothing else is sent, so the row's ring bytes per device
must equal the prediction exactly.  The Auto log line shown under "Using a
strategy" is the one auto_pricing.describe_choice writes for its configuration.
(tests/commands/test_docs_commands.py parses every command; its slow test runs the
first one and compares the table; no graph is built here.)
"""
import os
import re
import shlex

import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)

from mtf_talking_heads.estimate import auto_pricing
from mtf_talking_heads.measure import comm
from mtf_talking_heads.nn import strategies

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "docs", "sharding.md")


def _rows_with_commands():
  """(argv of the last `$ mtf_th comm` command, table row cells) pairs."""
  lines = open(DOC).read().splitlines()
  pairs, argv, i = [], None, 0
  while i < len(lines):
    line = lines[i].strip()
    if line.startswith("$ mtf_th comm"):
      text = line[2:]
      while text.endswith("\\"):
        i += 1
        text = text[:-1] + " " + lines[i].strip()
      argv = shlex.split(text)[2:]
    elif argv and line.startswith("|") and not line.startswith("|---"):
      cells = [c.strip() for c in line.strip("|").split("|")]
      if cells[0] != "variant" and len(cells) == len(comm.COLUMNS):
        pairs.append((argv, cells))
    elif argv and line.startswith("talking_heads,") or (
        argv and line.startswith("multi_head,")):
      pairs.append((argv, line.split(",")))
    i += 1
  return pairs


def _config(argv):
  args = dict(zip(argv[::2], argv[1::2]))
  number = lambda k: int(args[k]) if k in args else None  # noqa: E731
  return comm.make_config(
      args["--variant"], number("--heads"), number("--d_k"), number("--d_v"),
      number("--d_model"), number("--length"), number("--batch"),
      heads_k=number("--heads_k"), heads_v=number("--heads_v"),
      groups=number("--groups"))


def test_every_one_axis_row_equals_the_formula():
  pairs = _rows_with_commands()
  checked = 0
  for argv, cells in pairs:
    row = dict(zip(comm.COLUMNS, cells))
    mesh = row["mesh_shape"]
    if ";" in mesh:
      continue  # a batch axis: the other weights' all-reduce is added
    strategy = row["strategy"].split(":")[-1]
    layout = ";".join(r for r in row["layout"].split(";")
                      if not r.startswith("core_shard"))
    predicted = comm.predict(_config(argv), strategy, mesh, layout)
    assert round(predicted) == int(row["ring_bytes_per_device"]), (argv,
                                                                  row)
    checked += 1
  assert checked >= 20, checked  # the page's tables were found


def test_the_auto_log_line_shown_is_the_one_written():
  text = open(DOC).read()
  shown, = re.findall(r"^mtf_th\.Auto: .*$", text, re.M)
  config = comm.make_config("talking_heads", 24, 32, 32, 768, 512, 2,
                            heads_k=24, heads_v=24)
  auto = strategies.Auto()
  layer = comm.make_layer(config, auto)
  mesh = strategies.MeshLayout("model:8", comm.full_layout(
      comm.default_layout(layer, "model:8"), auto.layout_rules()))
  chosen, predicted, table = auto.choose(layer.dims, mesh, 2, 512, 768)
  assert shown == auto_pricing.describe_choice(
      "TalkingHeadsAttention", mesh, 2, 512, chosen.name, predicted, table)
