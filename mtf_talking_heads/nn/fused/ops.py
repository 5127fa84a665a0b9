"""The fused attention core as a differentiable TensorFlow function.

load() finds (building it when missing: build.py) and loads the op library
compiled from fused_core.cc, once per process; attention_core() is
reference.core's contract on that op, with its gradient (the op
FusedAttentionCoreGrad, which recomputes J, L, W, U block by block from the
inputs and the forward's per-row log-sum-exp).

Example (talking heads, B=2, G=1, h_k = h = h_v = 4, n = m = 8, d = 16):
  module, reason = ops.load()
  if module is None:
    print("einsum core:", reason)       # e.g. no C++ compiler
  else:
    o = ops.attention_core(q, k, v, p_l, p_w, bias)   # o: [2, 1, 4, 8, 16]
"""
import sys
import threading

import tensorflow.compat.v1 as tf

from mtf_talking_heads.nn.fused import build

_OUTCOME = []  # [(module or None, reason)] once load() has run
_LOCK = threading.Lock()


def load():
  """(the op module, reason) or (None, reason); never raises.

  The first call builds the library if it is not in the cache (printing one
  line to stderr first) and loads it; later calls return the same outcome
  (a failure is not retried in this process).

  Returns:
    (module, "loaded <path>") when the op is there; (None, reason) when it
    cannot be built or loaded, reason one line naming the cause and the fix,
    e.g. "no C++ compiler: 'g++' (the default) not found; install g++ or set
    CXX to a C++ compiler".
  """
  with _LOCK:
    if not _OUTCOME:
      _OUTCOME.append(_load())
  return _OUTCOME[0]


def _load():
  try:
    path = build.build(log=lambda line: print(line, file=sys.stderr))
  except build.BuildError as e:
    return None, str(e)
  except Exception as e:  # pylint: disable=broad-except  (never raise)
    return None, "building the fused attention core failed: %s" % (
        build.one_line(e))
  try:
    module = tf.load_op_library(path)
  except Exception as e:  # pylint: disable=broad-except  (never raise)
    return None, "loading %s failed: %s; delete it to rebuild" % (
        path, build.one_line(e))
  return module, "loaded %s" % path


def _empty(dtype):
  return tf.zeros([0], dtype)


def _attrs(op):
  return {name: op.get_attr(name) for name in
          ("has_p_l", "has_p_w", "has_bias", "bias_grad", "block_queries")}


@tf.RegisterGradient("FusedAttentionCore")
def _fused_core_grad(op, d_o, unused_d_lse):
  """dQ, dK, dV, dP_l, dP_w, dbias (None for absent inputs, and for the
  bias unless bias_grad).  lse is internal: attention_core never returns it."""
  module = load()[0]
  attrs = _attrs(op)
  grads = module.fused_attention_core_grad(
      *(list(op.inputs) + [op.outputs[1], d_o]), **attrs)
  return [grads[0], grads[1], grads[2],
          grads[3] if attrs["has_p_l"] else None,
          grads[4] if attrs["has_p_w"] else None,
          grads[5] if attrs["bias_grad"] else None]


def fused_core_with_stats(q, k, v, p_l=None, p_w=None, bias=None,
                          bias_grad=False, block_queries=0):
  """(O, lse): attention_core's op with its per-row log-sum-exp [B, G, H, N].

  block_queries: queries per block (0: the kernel's choice); for tests and
  tuning.
  """
  module, reason = load()
  if module is None:
    raise RuntimeError("the fused attention core is not available: %s"
                       % reason)
  q, k, v = (tf.convert_to_tensor(x) for x in (q, k, v))
  dtype = q.dtype
  if dtype not in (tf.float32, tf.float64):
    raise ValueError("fused attention core: q must be float32 or float64, "
                     "got %s" % dtype.name)
  inputs = [q, k, v]
  for name, x in (("k", k), ("v", v), ("p_l", p_l), ("p_w", p_w),
                  ("bias", bias)):
    if x is not None:
      x = tf.convert_to_tensor(x)
      if x.dtype != dtype:
        raise ValueError("fused attention core: %s is %s but q is %s; cast "
                         "them to one dtype" % (name, x.dtype.name,
                                                 dtype.name))
      if name in ("p_l", "p_w", "bias"):
        inputs.append(x)
    elif name in ("p_l", "p_w", "bias"):
      inputs.append(_empty(dtype))
  if bias_grad and bias is None:
    raise ValueError("fused attention core: bias_grad=True needs a bias")
  return module.fused_attention_core(
      *inputs, has_p_l=p_l is not None, has_p_w=p_w is not None,
      has_bias=bias is not None, bias_grad=bool(bias_grad),
      block_queries=block_queries)


def attention_core(q, k, v, p_l=None, p_w=None, bias=None, bias_grad=False):
  """reference.core(q, k, v, p_l, p_w, bias) by the fused op; differentiable.

  Args:
    q, k, v, p_l, p_w, bias: as reference.core (one dtype: float32 or
      float64; p_l, p_w, bias may be None).
    bias_grad: give the bias a gradient (T5's relative position bias);
      False (masks): its gradient is None and never computed.
  Returns:
    O [B, G, Hv, N, Dv].
  Raises:
    RuntimeError: load() failed (its reason in the message).
    ValueError: mixed or unsupported dtypes, bias_grad without a bias.
  """
  return fused_core_with_stats(q, k, v, p_l, p_w, bias, bias_grad)[0]
