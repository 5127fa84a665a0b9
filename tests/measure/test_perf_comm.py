"""prices.attention_elements equals what `mtf_th comm` measures.

step_time.py prices the model axis by formulas (pure Python, so `mtf_th perf`
needs no graph); here comm.measure lowers tiny mtf graphs (heads-parallel,
the default layout, float32) and its ring_bytes_per_device must equal the
formula x 4 bytes for every variant, with and without dynamic terms, on
model:2 and model:4.  About 25 s: ten tiny lowered graphs.
"""
import pytest

from mtf_talking_heads.estimate import model as model_lib
from mtf_talking_heads.estimate import prices
from mtf_talking_heads.measure import comm

CASES = [
    ("multi_head", ()), ("talking_heads", ()), ("project_logits", ()),
    ("project_weights", ()), ("talking_heads", ("x2l", "m2w")),
]


@pytest.mark.parametrize("mesh_shape", ["model:2", "model:4"])
@pytest.mark.parametrize("variant,dynamic", CASES,
                         ids=["+".join((v,) + d) for v, d in CASES])
def test_formula_equals_comm_measure(variant, dynamic, mesh_shape):
  heads, d_k, d_model, length, batch = 4, 4, 16, 8, 2
  config = comm.make_config(variant, heads, d_k, d_k, d_model, length, batch,
                            dynamic=dynamic)
  measured = comm.measure(config, "heads_parallel", mesh_shape)
  att = model_lib.make_attention(
      "dynamic_projections" if dynamic else variant, heads, d_k, d_k,
      dynamic=dynamic)
  p = model_lib.parse_mesh(mesh_shape)["model"]
  predicted = prices.attention_elements("heads_parallel", att, d_model,
                                        length, length, batch, p)
  assert measured["ring_bytes_per_device"] == pytest.approx(
      predicted * comm.BYTES_PER_ELEMENT)
  assert predicted > 0
