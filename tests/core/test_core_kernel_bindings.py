"""mtf_th.core_kernel checked as text, before TensorFlow (binding_checks).

A misspelt kind, another parameter of mtf_th.core_kernel and a misspelt
configurable name used to pass every check before TensorFlow (mtf_th plan
priced them; train refused them only after loading TensorFlow, 7 s).  The
kind is checked wherever it is bound: a --gin_param, or a gin file, with
or without a scope.  tests/commands/test_bad_inputs_plan.py runs the same
refusals through `mtf_th plan` and `mtf_th train`.
"""
import pytest

from mtf_talking_heads.core import binding_checks

LM = ["experiments/lm_heads/01_multi_head_4_32.gin", "models/lm_tiny.gin"]


def _check(params, files=()):
  binding_checks.check(binding_checks.read(LM + list(files), params), params)


@pytest.mark.parametrize("param,line", [
    ("mtf_th.core_kernel.kind = 'fusd'",
     "mtf_th.core_kernel.kind = 'fusd' is not a kernel: choose 'auto', "
     "'fused' or 'einsum'. Did you mean 'fused'?"),
    ("core_kernel.kind = 'EINSUM'",
     "mtf_th.core_kernel.kind = 'EINSUM' is not a kernel: choose 'auto', "
     "'fused' or 'einsum'. Did you mean 'einsum'?"),
    ("mtf_th.core_kernel.kind = 3",
     "mtf_th.core_kernel.kind = 3 is not a kernel: choose 'auto', 'fused' "
     "or 'einsum'."),
    ("mtf_th.core_kernel.knd = 'fused'",
     "--gin_param \"mtf_th.core_kernel.knd = 'fused'\": mtf_th.core_kernel "
     "has no parameter 'knd'; its one parameter is kind = 'auto', 'fused' "
     "or 'einsum'"),
    ("mtf_th.core_kernl.kind = 'fused'",
     "--gin_param \"mtf_th.core_kernl.kind = 'fused'\" binds "
     "mtf_th.core_kernl, which is no configurable: the attention core's "
     "kernel is mtf_th.core_kernel.kind = 'auto', 'fused' or 'einsum'"),
])
def test_refused_in_one_line(param, line):
  with pytest.raises(ValueError) as e:
    _check([param])
  assert str(e.value) == line


def test_a_gin_files_binding_is_checked_too(tmp_path):
  path = tmp_path / "kernel.gin"
  path.write_text("train/mtf_th.core_kernel.kind = 'fast'\n")
  with pytest.raises(ValueError, match=r"^mtf_th.core_kernel.kind = 'fast' "
                     r"is not a kernel: choose 'auto', 'fused' or 'einsum'\."
                     r"( Did you mean 'fused'\?)?$"):
    _check([], [str(path)])


@pytest.mark.parametrize("kind", binding_checks.CORE_KERNEL_KINDS)
def test_every_kind_is_accepted(kind):
  _check(["mtf_th.core_kernel.kind = %r" % kind])
