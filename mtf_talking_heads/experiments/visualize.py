"""What the heads say to each other: the learned P_l, P_w of a checkpoint.

Reproduces the paper's figure "Visualization of the learned projection
matrices P_l, P_w, and the multiplication P_l x P_w" (section "Visualizing
the Projection Matrices of Talking-Heads"): one row per attention layer,
three heatmaps per row, every matrix divided by its largest absolute entry so
that it lies in [-1, 1].  Beside the picture it reports what the paper
reports about conditioning ("magnitude of determinant above 1e-9 with
smallest eigenvalue above 1e-3" for BERT): each matrix's |det| and smallest
singular value, and, for its remark that the diagonals are not larger than
the other entries, the ratio of mean |diagonal| to mean |off-diagonal|
entry.  Given a baseline checkpoint (e.g. the initialisation, model.ckpt-0),
it also reports how far training moved each matrix.

Only the checkpoint is read (tf.train.load_checkpoint), no graph is built, so
any model whose attention layers name their variables ``.../p_l`` and
``.../p_w`` (layers.py) can be inspected, e.g.

  encoder/block_000/layer_000/TalkingHeadsAttention/p_l  [heads_k, heads]
  encoder/block_000/layer_000/TalkingHeadsAttention/p_w  [heads, heads_v]

P_l x P_w is the [heads_k, heads_v] matrix einsum(P_l[h_k, h], P_w[h, h_v]):
what a logit of key/query head i would contribute to value head j if the
softmax between the two projections were linear.

Example:
  layers = read_projections("/tmp/th_model")
  rows = projection_stats(layers)        # [{"layer", "matrix", "abs_det", ...}]
  plot_projections(layers, "/tmp/th_model/projections.png")
"""
import collections
import csv
import os

import numpy as np

from mtf_talking_heads.runtime import identity
from mtf_talking_heads.runtime import run_checks
from mtf_talking_heads.runtime import run_files

# Variable-name leaf of each talking-heads projection (layers.py).
P_L, P_W = "p_l", "p_w"
MATRICES = ("P_l", "P_w", "P_l x P_w")
STATS_COLUMNS = ("layer", "matrix", "rows", "cols", "max_abs", "abs_det",
                 "min_singular", "max_singular", "diag_to_offdiag",
                 "change")

LayerProjections = collections.namedtuple(
    "LayerProjections", ["layer", "p_l", "p_w"])
LayerProjections.__doc__ = """P_l and P_w of one attention layer.

Attributes:
  layer: the variable scope, e.g. "encoder/block_000/layer_000/TalkingHeadsAttention".
  p_l: float64 array [heads_k, heads], or None (weights-projection only).
  p_w: float64 array [heads, heads_v], or None (logits-projection only).
"""


def latest_checkpoint(model_dir, flag="--model_dir"):
  """The checkpoint prefix to read: the latest one in `model_dir`.

  Args:
    model_dir: a training directory (with a `checkpoint` index file), or a
      checkpoint prefix such as ".../model.ckpt-1000".

  Returns:
    the checkpoint prefix.

  Raises:
    ValueError: naming model_dir, if it holds no checkpoint or the one it
      names is damaged (runtime/run_checks.prefix_refusal).
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  damaged = run_checks.prefix_refusal(model_dir, flag)
  if damaged:
    raise ValueError(damaged)
  if os.path.isdir(model_dir):
    path = run_files.latest_checkpoint(model_dir)
    if path is None:
      raise ValueError(
          "%s %s has no checkpoint (no 'checkpoint' file naming a "
          "model.ckpt-N); train first, or pass a checkpoint prefix such as "
          "%s/model.ckpt-1000" % (flag, model_dir, model_dir))
    return path
  if tf.io.gfile.exists(model_dir + ".index"):
    return model_dir
  raise ValueError("%s %s is neither a directory nor a checkpoint "
                   "prefix (no %s.index)" % (flag, model_dir, model_dir))


def _as_matrix(name, value):
  value = np.asarray(value, dtype=np.float64)
  if value.ndim != 2:
    raise ValueError(
        "variable %r has shape %s; visualize reads ungrouped talking-heads "
        "projections, which are matrices: grouped talking heads "
        "([groups, heads_k, heads] blocks) and ensembles are not supported"
        % (name, value.shape))
  return value


def _layer_order(scope):
  """Encoder layers first, then decoder, then anything else; by name within."""
  stack = scope.split("/", 1)[0]
  return ({"encoder": 0, "decoder": 1}.get(stack, 2), scope)


def read_projections(model_dir, flag="--model_dir"):
  """Every layer's P_l and P_w from the latest checkpoint of `model_dir`.

  Args:
    model_dir: a training directory or a checkpoint prefix.

  Returns:
    (checkpoint prefix, [LayerProjections]: encoder layers, then decoder
    layers, then any other stack, each in variable-name order).

  Raises:
    ValueError: if there is no checkpoint, or no variable named .../p_l or
      .../p_w in it (e.g. a multi-head model).
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  path = latest_checkpoint(model_dir, flag)
  found = collections.defaultdict(dict)
  try:
    reader = tf.train.load_checkpoint(path)
    for name in sorted(reader.get_variable_to_shape_map()):
      scope, _, leaf = name.rpartition("/")
      if leaf in (P_L, P_W):
        found[scope][leaf] = _as_matrix(name, reader.get_tensor(name))
  except tf.errors.OpError as e:  # e.g. data bytes garbled (a checksum)
    cause = (str(e.message or e).strip().splitlines() or ["?"])[0]
    raise ValueError(
        "%s %s: TensorFlow cannot read checkpoint %s (%s): restore its "
        "files, or pass another checkpoint" % (flag, model_dir, path,
                                               cause)) from None
  if not found:
    raise ValueError(
        "checkpoint %s has no talking-heads projections (no variable named "
        ".../%s or .../%s): it is a multi-head or general-bilinear model, "
        "whose heads do not talk; pass the model_dir of a talking_heads, "
        "project_logits, project_weights or dynamic_projections model"
        % (path, P_L, P_W))
  layers = []
  for scope in sorted(found, key=_layer_order):
    p_l, p_w = found[scope].get(P_L), found[scope].get(P_W)
    if p_l is not None and p_w is not None and p_l.shape[1] != p_w.shape[0]:
      raise ValueError(
          "layer %s: P_l is %s and P_w is %s; their shared `heads` dims "
          "differ" % (scope, p_l.shape, p_w.shape))
    layers.append(LayerProjections(scope, p_l, p_w))
  return path, layers


def layer_matrices(layer):
  """{"P_l", "P_w", "P_l x P_w": array or None} for one LayerProjections."""
  product = None
  if layer.p_l is not None and layer.p_w is not None:
    product = layer.p_l @ layer.p_w  # [h_k, h] x [h, h_v] -> [h_k, h_v]
  return dict(zip(MATRICES, (layer.p_l, layer.p_w, product)))


def normalized(matrix):
  """`matrix` divided by its largest absolute entry: entries in [-1, 1]."""
  scale = np.max(np.abs(matrix))
  return matrix / scale if scale > 0 else matrix


def matrix_stats(matrix):
  """Conditioning figures of one matrix, as the paper reports them.

  Args:
    matrix: a 2-d float array.

  Returns:
    dict(rows, cols, max_abs, abs_det, min_singular, max_singular,
    diag_to_offdiag).  The singular values are of the raw (not normalized)
    matrix.  diag_to_offdiag is mean |diagonal entry| / mean |off-diagonal
    entry|, the paper's "the main diagonals ... do not have significant
    greater values than other entries" as a number (1: no diagonal
    preference; inf for a diagonal matrix).  abs_det and diag_to_offdiag are
    None for a non-square matrix (e.g. P_l with heads_k != heads).
  """
  singular = np.linalg.svd(matrix, compute_uv=False)
  rows, cols = matrix.shape
  square = rows == cols
  ratio = None
  if square and rows > 1:
    diag = np.mean(np.abs(np.diag(matrix)))
    off = np.mean(np.abs(matrix[~np.eye(rows, dtype=bool)]))
    ratio = float(diag / off) if off > 0 else float("inf")
  return dict(
      rows=rows, cols=cols, max_abs=float(np.max(np.abs(matrix))),
      abs_det=float(abs(np.linalg.det(matrix))) if square else None,
      min_singular=float(singular.min()), max_singular=float(singular.max()),
      diag_to_offdiag=ratio)


def relative_change(matrix, baseline):
  """||matrix - baseline||_F / ||baseline||_F: how far training moved it."""
  return float(np.linalg.norm(matrix - baseline) / np.linalg.norm(baseline))


def projection_stats(layers, baseline_layers=None):
  """One dict per (layer, matrix) with STATS_COLUMNS as keys.

  Args:
    layers: [LayerProjections] (read_projections).
    baseline_layers: optional [LayerProjections] of another checkpoint of
      the same model, e.g. its initialisation (model.ckpt-0); fills "change"
      with relative_change(matrix, its baseline).  None: "change" is None.
  Raises:
    ValueError: if the baseline lacks a layer or a matrix has another shape.
  """
  base = {l.layer: layer_matrices(l) for l in baseline_layers or ()}
  rows = []
  for layer in layers:
    for name, matrix in layer_matrices(layer).items():
      if matrix is None:
        continue
      change = None
      if baseline_layers is not None:
        before = base.get(layer.layer, {}).get(name)
        if before is None or before.shape != matrix.shape:
          raise ValueError(
              "baseline has no %s %s of shape %s: pass a checkpoint of the "
              "same model (e.g. <model_dir>/model.ckpt-0)"
              % (layer.layer, name, matrix.shape))
        change = relative_change(matrix, before)
      rows.append(dict(layer=layer.layer, matrix=name, change=change,
                       **matrix_stats(matrix)))
  return rows


def _cell(value):
  if value is None:
    return ""
  if isinstance(value, float):
    return "%.6g" % value
  return str(value)


def write_stats_csv(rows, path):
  """Writes projection_stats rows to `path` (empty cell: not square)."""
  with open(path, "w", newline="") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(STATS_COLUMNS)
    for row in rows:
      writer.writerow([_cell(row[c]) for c in STATS_COLUMNS])


def format_stats(rows):
  """The stats as an aligned text table (what `mtf_th visualize` prints)."""
  with_change = any(row.get("change") is not None for row in rows)
  header = ("layer", "matrix", "shape", "|det|", "min singular",
            "|diag|/|offdiag|") + (("change",) if with_change else ())
  lines = [[row["layer"], row["matrix"], "%dx%d" % (row["rows"], row["cols"]),
            "n/a" if row["abs_det"] is None else "%.3e" % row["abs_det"],
            "%.3e" % row["min_singular"],
            "n/a" if row["diag_to_offdiag"] is None
            else "%.2f" % row["diag_to_offdiag"]]
           + (["%.3f" % row["change"]] if with_change else [])
           for row in rows]
  widths = [max(len(r[i]) for r in [header] + lines)
            for i in range(len(header))]
  fmt = "  ".join("%%-%ds" % w for w in widths)
  return "\n".join(fmt % tuple(r) for r in [header] + lines) + "\n"


def _short_name(scope):
  """encoder/block_003/layer_000/TalkingHeadsAttention -> encoder 3.0 TalkingHeadsAttention."""
  parts = scope.split("/")
  out = []
  for part in parts:
    for prefix in ("block_", "layer_"):
      if part.startswith(prefix) and part[len(prefix):].isdigit():
        part = str(int(part[len(prefix):]))
    out.append(part)
  return " ".join(out)


def plot_projections(layers, path, title=None):
  """Draws the paper's figure: one row per layer, columns P_l, P_w, P_l x P_w.

  Every matrix is normalized to [-1, 1] (divided by its max |entry|) and
  drawn with the same diverging colour map; a missing matrix (a layer with
  only one projection) leaves its panel empty with a note.

  Args:
    layers: [LayerProjections].
    path: the PNG file to write.
    title: optional figure title (e.g. the checkpoint).
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  n = len(layers)
  fig, axes = plt.subplots(n, 3, figsize=(9.0, 2.6 * n + 0.8), squeeze=False,
                           layout="constrained")
  image = None
  for row, layer in enumerate(layers):
    for col, (name, matrix) in enumerate(layer_matrices(layer).items()):
      ax = axes[row][col]
      ax.set_xticks([])
      ax.set_yticks([])
      if matrix is None:
        ax.text(0.5, 0.5, "no %s" % name, ha="center", va="center",
                transform=ax.transAxes, color="gray")
        ax.set_frame_on(False)
      else:
        image = ax.imshow(normalized(matrix), cmap="RdBu_r", vmin=-1.0,
                          vmax=1.0, interpolation="nearest")
      if row == 0:
        ax.set_title(name)
      if col == 0:
        ax.set_ylabel(_short_name(layer.layer), fontsize=7)
  if image is not None:
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=min(0.6, 3.0 / n),
                 label="entry / max |entry|")
  if title:
    fig.suptitle(title, fontsize=8)
  fig.savefig(path, dpi=100)
  plt.close(fig)


def check_same_model(path, baseline):
  """The baseline checkpoint holds the same weights (names and shapes) as
  checkpoint `path` (runtime/identity.py; optimizer slots aside).

  Raises:
    ValueError: one line naming --baseline and the difference.
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top

  def shapes(prefix):
    return identity.weights({name: (list(shape), None) for name, shape in
                             tf.train.list_variables(prefix)})

  difference = identity.describe_difference(
      shapes(path), shapes(baseline), os.path.basename(path),
      "the baseline", dtypes=False)
  if difference:
    raise ValueError(
        "--baseline %s holds another model than %s: %s; pass a checkpoint "
        "of the same model (e.g. %s)" % (
            baseline, path, difference,
            os.path.join(os.path.dirname(path), "model.ckpt-0")))


def visualize(model_dir, output_dir=None, baseline=None):
  """Reads the latest checkpoint, writes the figure and the stats CSV.

  Args:
    model_dir: a training directory or a checkpoint prefix.
    output_dir: where to write projections.png and projections.csv
      (default: model_dir, or the prefix's directory).
    baseline: optional checkpoint (prefix or directory) of the same model,
      e.g. <model_dir>/model.ckpt-0; the stats then say how far each matrix
      moved from it ("change" = ||P - P_0||_F / ||P_0||_F).

  Returns:
    dict(checkpoint, png, csv, stats) where stats are projection_stats rows.

  Raises:
    ValueError: no checkpoint, no P_l / P_w in it, or a baseline of
      another model (check_same_model).
  """
  path, layers = read_projections(model_dir)
  if baseline:
    check_same_model(path, latest_checkpoint(baseline, "--baseline"))
  if output_dir is None:
    output_dir = model_dir if os.path.isdir(model_dir) else os.path.dirname(
        model_dir)
  os.makedirs(output_dir, exist_ok=True)
  baseline_layers = (read_projections(baseline, "--baseline")[1]
                     if baseline else None)
  stats = projection_stats(layers, baseline_layers)
  png = os.path.join(output_dir, "projections.png")
  csv_path = os.path.join(output_dir, "projections.csv")
  plot_projections(layers, png, title=path)
  write_stats_csv(stats, csv_path)
  return dict(checkpoint=path, png=png, csv=csv_path, stats=stats)
