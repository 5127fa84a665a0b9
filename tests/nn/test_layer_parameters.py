"""core/binding_checks.py (gin as text, before TensorFlow) agrees with the
layers and with nn/gin_checks.py (gin's live bindings, after parsing).

* layer_parameters(class) is exactly what each mtf_th attention class takes:
  every parameter of any class is given to every class, accepted iff the
  table lists it (a class refuses it with ValueError or TypeError);
* the bindings tests/nn/test_gin_checks.py has the live check refuse are
  refused as text with the same line (up to the list of the classes the
  configuration uses; but the one binding whose use only the live
  configuration shows: a scoped layer stack shadowing mtf's defaults.gin),
  and the ones it accepts are accepted.
"""
import pytest

from mtf_talking_heads import training
from mtf_talking_heads.core import binding_checks
from mtf_talking_heads.core import spec
from mtf_talking_heads.nn import layers
from test_gin_checks import ACCEPTED, REFUSED

CLASSES = [c for v in spec.VARIANT_TABLE for c in spec.layer_class_names(v.name)
           if hasattr(layers, c)]
EVERY = sorted({p for c in CLASSES for p in binding_checks.layer_parameters(c)})
# a valid value of each parameter (one a class with the parameter accepts)
VALUES = {"heads_k": 8, "heads": 4, "heads_v": 8, "d_k": 8, "d_v": 8,
          "dynamic": ("x2l",), "dynamic_init_scale": 0.2, "dropout_rate": 0.1,
          "relative_attention_type": "bias",
          "relative_attention_num_buckets": 16, "strategy": None,
          "groups": 2}
TEXT_CANNOT_SEE = ("mtf_layer_shadowed_by_our_stacks",)


def test_every_variant_class_is_checked():
  assert len(CLASSES) == 2 * len(spec.VARIANT_TABLE)
  assert set(VALUES) == set(EVERY)


@pytest.mark.parametrize("name", CLASSES)
def test_layer_parameters_are_what_the_class_takes(name):
  cls = getattr(layers, name)
  own = binding_checks.layer_parameters(name)
  base = {"groups": 2} if "groups" in own else {}
  taken = []
  for param in EVERY:
    value = VALUES[param]
    if param == "dynamic" and "ProjectWeights" in name:
      value = ("x2w",)  # the terms of the projection it has
    try:
      cls(**dict(base, **{param: value}))
    except (TypeError, ValueError):
      continue
    taken.append(param)
  assert sorted(taken) == sorted(own)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_text_refuses_what_the_live_check_refuses(name):
  files, params, _ = REFUSED[name]
  config = binding_checks.read(files, params)
  if name in TEXT_CANNOT_SEE:
    binding_checks.check(config, params)
    return
  with pytest.raises(ValueError) as text:
    binding_checks.check(config, params)
  with pytest.raises(training.ConfigError) as live:
    training.parse_gin(files, params)
  # the live "(Used: ...)" also lists the other layers (DenseReluDense),
  # which the text cannot tell from functions
  assert str(text.value).split(" (Used:")[0] == str(live.value).split(
      " (Used:")[0]


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_text_accepts_what_the_live_check_accepts(name):
  files, params = ACCEPTED[name]
  binding_checks.check(binding_checks.read(files, params), params)
