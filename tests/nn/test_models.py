"""The gin files describe the paper's models: every table row, both scales.

One subprocess parses every gin/experiments/<table>/<row>.gin of the paper's
tables (the small-regime ones are tests/training/test_small_regime.py's) alone (base)
and followed by its scale file (tiny), instantiates the layer stacks (no
graph) and reports macros, layer classes and weight shapes as JSON; the
tests compare them with the paper (parameters per attention layer from
costs.PAPER_TABLES) and with the sweep convention.  gin's global state stays
out of the pytest process (other tests rely on theirs).
"""
import json
import subprocess
import sys

import pytest

from _cli_util import REPO
from mtf_talking_heads.estimate import costs


_SCRIPT = r"""
import json, sys
import mtf_talking_heads
from mtf_talking_heads import training
from mtf_talking_heads.nn import models
import mesh_tensorflow as mtf

SMALL_TABLES = ("lm_heads", "lm_variants", "encdec_heads", "span_heads",
                "scaling_d128", "scaling_d192", "scaling_d256")
SCALES = {"t5": "models/t5_tiny.gin", "bert": "models/bert_tiny.gin",
          "albert": "models/albert_tiny.gin"}
MACROS = ("row_label", "variant", "heads_k", "heads", "heads_v", "d_k", "d_v",
          "dynamic", "placement", "d_model", "num_layers", "dropout_rate",
          "inputs_length", "targets_length", "batch_size")

def report(files):
  training.parse_gin(files, [])
  out = {k: models.query(k) for k in MACROS}
  out["model_type"] = models.query("utils.run.model_type")
  desc = models.describe(out["model_type"], 8100)
  d_model = mtf.Dimension("d_model", desc.d_model)
  out["stacks"] = {}
  for name, layers in desc.stacks.items():
    rows = []
    for layer in layers:
      entry = {"class": type(layer).__name__, "name": layer.name}
      if hasattr(layer, "weight_shapes"):
        shapes = layer.weight_shapes(d_model)
        entry["params"] = sum(mtf.Shape(s).size for s in shapes.values())
        entry["weights"] = sorted(shapes)
        entry["heads"] = [[d.name, d.size] for d in layer.activation_heads()]
        entry["dynamic"] = list(getattr(layer, "dynamic", ()))
        entry["relative"] = getattr(layer, "relative_attention_type", None)
        entry["dropout"] = getattr(layer, "dropout_rate", None)
      rows.append(entry)
    out["stacks"][name] = rows
  out["dims"] = desc.dims
  return out

result = {}
for table, files in models.experiment_tables().items():
  if table in SMALL_TABLES:  # small-regime models: tests/training/test_small_regime.py
    continue
  for f in files:
    family = "albert" if "albert" in table else ("bert" if "bert" in table else "t5")
    result[f] = {"base": report([f]), "tiny": report([f, SCALES[family]])}
for f in ("models/t5_base.gin", "models/bert_base.gin", "models/albert_base.gin"):
  result[f] = {"base": report([f])}
json.dump(result, sys.stdout)
"""

EXPECTED_ROWS = {
    "t5_heads": 11, "t5_heads_dims": 6, "t5_logits_weights": 4,
    "t5_enc_dec": 5, "dp": 6, "dp_individual": 6, "dp_enc_only": 3,
    "albert_heads": 8, "albert_logits_weights": 4, "bert_heads": 10,
}
VARIANTS = ("multi_head", "talking_heads", "project_logits",
            "project_weights", "general_bilinear", "dynamic_projections")
CLASSES = {
    "multi_head": "MultiHeadAttention", "talking_heads": "TalkingHeadsAttention",
    "project_logits": "ProjectLogitsAttention",
    "project_weights": "ProjectWeightsAttention",
    "general_bilinear": "GeneralBilinearAttention",
    "dynamic_projections": "DynamicProjectionsAttention",
}


@pytest.fixture(scope="module")
def reports():
  proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout)


def _experiments(reports):
  return {k: v for k, v in reports.items() if k.startswith("experiments")}


def test_every_table_has_its_rows_in_file_order(reports):
  tables = {}
  for path in _experiments(reports):
    _, table, name = path.split("/")
    tables.setdefault(table, []).append(name)
  assert {t: len(v) for t, v in tables.items()} == EXPECTED_ROWS
  for names in tables.values():
    assert [int(n.split("_")[0]) for n in sorted(names)] == list(
        range(1, len(names) + 1))


def test_sweep_macros_are_defined_with_the_right_types(reports):
  for path, r in _experiments(reports).items():
    for scale in ("base", "tiny"):
      m = r[scale]
      assert isinstance(m["row_label"], str) and m["row_label"], path
      assert m["variant"] in VARIANTS, path
      for k in ("heads_k", "heads", "heads_v", "d_k", "d_v"):
        assert isinstance(m[k], int) and m[k] > 0, (path, k)
      assert isinstance(m["dynamic"], list), path
      assert m["placement"] in ("all", "enc_self", "dec_self", "encdec"), path
      if m["variant"] == "multi_head":
        assert m["heads_k"] == m["heads"] == m["heads_v"], path


def test_paper_labels_and_dims_match_costs_tables(reports):
  """Rows of the tables costs.py knows: same labels, dims and parameters."""
  for table, paper in costs.PAPER_TABLES.items():
    files = sorted(p for p in _experiments(reports)
                   if p.split("/")[1] == table)
    assert len(files) == len(paper.rows), table
    for path, row in zip(files, paper.rows):
      base = reports[path]["base"]
      assert base["row_label"] == row.label, path
      assert base["heads"] == row.heads, path
      assert (base["d_k"], base["d_v"]) == (row.d_k, row.d_v), path
      assert sorted(base["dynamic"]) == sorted(row.dynamic), path
      enc_self = [l for l in base["stacks"]["encoder"] if "params" in l][0]
      # the paper's "parameters per attention layer", from the built layer
      assert enc_self["params"] == row.params, (path, enc_self["params"],
                                                row.params)


def test_layers_are_placed_as_the_row_says(reports):
  for path, r in _experiments(reports).items():
    m = r["base"]
    want = CLASSES[m["variant"]]
    attention = {name: [l for l in layers if "params" in l]
                 for name, layers in m["stacks"].items()}
    if m["model_type"] == "bitransformer":
      enc_self = attention["encoder"]
      dec_self = attention["decoder"][0::2]
      encdec = attention["decoder"][1::2]
      placed = {"enc_self": enc_self, "dec_self": dec_self, "encdec": encdec}
      for where, layers in placed.items():
        on = m["placement"] in ("all", where)
        for layer in layers:
          cls = layer["class"].replace("EncoderAttention", "Attention")
          assert cls == (want if on else "MultiHeadAttention"), (path, where)
        assert len(layers) == 12, path
    else:
      assert m["placement"] == "all"
      assert [l["class"] for l in attention["transformer"]] == [want] * 12
    for layers in attention.values():
      for layer in layers:
        sizes = dict(layer["heads"])
        if m["variant"] in ("talking_heads", "dynamic_projections") and \
            layer["class"] == want.replace("Attention", "") + "Attention":
          assert sizes == {"heads_k": m["heads_k"], "heads": m["heads"],
                           "heads_v": m["heads_v"]}, path
        assert sorted(layer["dynamic"]) == (
            sorted(m["dynamic"]) if layer["class"].startswith("Dynamic")
            else []), path


def test_tiny_scale_shrinks_the_model_and_keeps_the_attention(reports):
  for path, r in _experiments(reports).items():
    base, tiny = r["base"], r["tiny"]
    assert base["d_model"] == 768 and tiny["d_model"] == 64, path
    assert tiny["inputs_length"] == 64 and base["inputs_length"] == 512, path
    for k in ("row_label", "variant", "heads_k", "heads", "heads_v", "d_k",
              "d_v", "dynamic", "placement", "dropout_rate"):
      assert base[k] == tiny[k], (path, k)
    base_layers = [l for s in base["stacks"].values() for l in s if "params" in l]
    tiny_layers = [l for s in tiny["stacks"].values() for l in s if "params" in l]
    assert [l["heads"] for l in tiny_layers[:2]] == [
        l["heads"] for l in base_layers[:2]], path
    assert len(tiny_layers) < len(base_layers), path


def test_t5_base_is_the_papers_setup(reports):
  m = reports["models/t5_base.gin"]["base"]
  assert m["model_type"] == "bitransformer"
  assert (m["d_model"], m["num_layers"], m["dims"]["d_ff"]) == (768, 12, 3072)
  assert m["dropout_rate"] == 0.0
  assert (m["inputs_length"], m["targets_length"], m["batch_size"]) == (
      512, 114, 128)
  assert len([l for l in m["stacks"]["encoder"] if "params" in l]) == 12
  enc = [l for l in m["stacks"]["encoder"] if "params" in l][0]
  assert enc["relative"] == "bias_shared" and enc["params"] == 2359296
  encdec = [l for l in m["stacks"]["decoder"] if "params" in l][1]
  assert encdec["class"] == "MultiHeadEncoderAttention"
  assert encdec["relative"] is None


def test_bert_and_albert(reports):
  bert = reports["models/bert_base.gin"]["base"]
  albert = reports["models/albert_base.gin"]["base"]
  for m in (bert, albert):
    assert m["model_type"] == "aligned" and m["d_model"] == 768
    assert m["targets_length"] == m["inputs_length"] == 512
  assert [l for l in bert["stacks"]["transformer"] if "params" in l][0][
      "relative"] == "bias_shared"
  # ALBERT: one name per layer kind in every block (shared variables),
  # factorised embedding, position embeddings, no relative bias
  names = {l["name"] for l in albert["stacks"]["transformer"]}
  assert names == {"shared_attention", "shared_feed_forward"}
  assert len(albert["stacks"]["transformer"]) == 24
  assert "inner_vocab" not in albert["dims"]  # embedding size = d_model
  assert albert["dims"]["max_length"] == 512
  # BERT up to 768 heads with d_k = d_v = 1
  last = reports["experiments/bert_heads/10_talking_heads_768_1.gin"]["base"]
  assert (last["heads"], last["d_k"], last["d_v"]) == (768, 1, 1)
  layer = [l for l in last["stacks"]["transformer"] if "params" in l][0]
  assert layer["params"] == costs.attention_costs(
      "talking_heads", 768, 768, 768, 1, 1, 768, 512)["params"]


def test_gin_imports_of_module_paths_before_the_split_still_work():
  # model_dirs trained before the package was split by job have
  # `import mtf_talking_heads.layers` in their operative_config.gin
  import gin  # pylint: disable=g-import-not-at-top
  import mtf_talking_heads  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import layers  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.nn import optimizers  # pylint: disable=g-import-not-at-top
  with gin.unlock_config():
    gin.parse_config("import mtf_talking_heads.layers\n"
                     "import mtf_talking_heads.optimizers")
  assert sys.modules["mtf_talking_heads.layers"] is layers
  assert sys.modules["mtf_talking_heads.optimizers"] is optimizers
  assert set(mtf_talking_heads.MOVED_MODULES) == {
      "mtf_talking_heads." + m
      for m in ("layers", "optimizers", "models", "attention")}
