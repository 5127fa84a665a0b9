"""The fused attention core (nn/fused: fused_core.cc, build.py, ops.py)
against its definition, reference.core.

1. Forward and every gradient (dQ, dK, dV, dP_l, dP_w, dbias) of
   ops.attention_core equal reference.core's, for multi-head, talking heads
   with h_k != h != h_v, logits-only, weights-only and grouped talking
   heads, with no bias, a causal mask [1, 1, N, M], a padding mask
   [B, 1, N, M] and relative-position-like biases [1, G*H, N, M],
   [B, G*H, N, M] and [1, 1, N, M] (with their gradient), N != M, B = 1,
   sizes that are not multiples of the block (4 queries, or the kernel's
   choice) nor of a packet: float32 within 1e-5 of the float64 reference
   (relative to the largest value), float64 within 1e-12.
2. A numerical gradient check of every input, in float64.
3. The kernel's own shape errors (InvalidArgument, one line naming the
   input and the shape it must have) and the Python wrapper's ValueErrors.
4. Without a compiler (CXX pointing at a missing program, an empty cache)
   load() returns None and a one-line reason naming the compiler, twice
   without retrying, and nothing raises; a failing compile is one line too
   and leaves no file; the library's name changes with the source and the
   compiler (a stale library is never loaded).
All graphs share one session.
"""
import os
import subprocess
import sys

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from _cli_util import REPO
from mtf_talking_heads.nn.fused import build
from mtf_talking_heads.nn.fused import ops
from mtf_talking_heads.nn.fused import reference

MODULE, REASON = ops.load()
GRAPH = tf.Graph()
_SESSION = []
TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}


def session():
  if not _SESSION:
    _SESSION.append(tf.Session(graph=GRAPH))
  return _SESSION[0]


def relative(got, want):
  return np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)


# name: B, G, Hk, H, Hv, N, M, Dk, Dv, which projections, bias, block.
# bias: None, "causal" [1,1,N,M], "padding" [B,1,N,M] (masks: no gradient),
# "relative" [1,G*H,N,M], "full" [B,G*H,N,M], "shared" [1,1,N,M] (values
# with a gradient).  block: queries per block (0: the kernel's choice).
BASE = dict(B=2, G=1, Hk=3, H=3, Hv=3, N=13, M=11, Dk=6, Dv=5, p_l=False,
            p_w=False, bias=None, block=4)
CASES = {
    "multi_head": {},
    "multi_head_causal": dict(bias="causal"),
    "multi_head_relative_bias": dict(bias="relative"),
    "multi_head_padding_auto_block": dict(bias="padding", block=0),
    "multi_head_grouped": dict(G=2, bias="full"),
    "talking_heads_3_4_5": dict(Hk=3, H=4, Hv=5, p_l=True, p_w=True),
    "talking_heads_causal": dict(H=4, p_l=True, p_w=True, bias="causal"),
    "talking_heads_padding": dict(Hv=4, H=4, p_l=True, p_w=True,
                                  bias="padding"),
    "talking_heads_relative_bias": dict(H=4, Hv=2, p_l=True, p_w=True,
                                        bias="relative"),
    "talking_heads_full_bias": dict(H=4, p_l=True, p_w=True, bias="full"),
    "talking_heads_shared_bias": dict(H=4, p_l=True, p_w=True,
                                      bias="shared"),
    "talking_heads_batch_1_auto_block": dict(B=1, H=4, p_l=True, p_w=True,
                                             bias="causal", block=0),
    "talking_heads_many_blocks": dict(B=1, N=37, M=29, H=4, p_l=True,
                                      p_w=True, bias="relative"),
    # packets: M and D over one packet (16 floats, 8 doubles) plus a tail,
    # more heads than a register tile (8 rows)
    "talking_heads_packets": dict(B=1, Hk=5, H=9, Hv=6, N=21, M=70, Dk=20,
                                  Dv=36, p_l=True, p_w=True, bias="full",
                                  block=8),
    "multi_head_packets": dict(Hk=2, H=2, Hv=2, N=21, M=70, Dk=36, Dv=20,
                               bias="causal", block=8),
    "logits_only": dict(Hk=3, H=4, Hv=4, p_l=True),
    "logits_only_relative_bias": dict(Hk=3, H=4, Hv=4, p_l=True,
                                      bias="relative"),
    "weights_only": dict(Hk=3, H=3, Hv=5, p_w=True, bias="padding"),
    "weights_only_relative_bias": dict(Hv=5, p_w=True, bias="relative"),
    "grouped": dict(G=2, Hk=2, H=3, Hv=2, p_l=True, p_w=True,
                    bias="relative"),
    "grouped_padding": dict(G=2, Hk=2, H=3, Hv=4, p_l=True, p_w=True,
                            bias="padding"),
    "grouped_shared_bias": dict(G=2, Hk=2, H=3, Hv=2, p_l=True, p_w=True,
                                bias="shared"),
}
BIAS_GRAD = {"relative", "full", "shared"}


def make_inputs(c, rng):
  """(inputs dict of float64 arrays, names with a gradient)."""
  B, G, N, M = c["B"], c["G"], c["N"], c["M"]
  x = {"q": rng.randn(B, G, c["Hk"], N, c["Dk"]),
       "k": rng.randn(B, G, c["Hk"], M, c["Dk"]),
       "v": rng.randn(B, G, c["Hv"], M, c["Dv"])}
  if c["p_l"]:
    x["p_l"] = rng.randn(G, c["Hk"], c["H"]) / np.sqrt(c["Hk"])
  if c["p_w"]:
    x["p_w"] = rng.randn(G, c["H"], c["Hv"]) / np.sqrt(c["H"])
  n, m = np.arange(N)[:, None], np.arange(M)[None, :]
  if c["bias"] == "causal":
    x["bias"] = np.where(m > n, -1e9, 0.0)[None, None]
  elif c["bias"] == "padding":  # batch b sees its first M - 2 b keys
    keep = np.arange(M)[None, :] < (M - 2 * np.arange(B))[:, None]
    x["bias"] = np.where(keep, 0.0, -1e9)[:, None, None, :].repeat(N, 2)
  elif c["bias"] in BIAS_GRAD:
    shape = {"relative": [1, G * c["H"], N, M], "full": [B, G * c["H"], N, M],
             "shared": [1, 1, N, M]}[c["bias"]]
    x["bias"] = rng.randn(*shape)
  wrt = [name for name in x if name != "bias" or c["bias"] in BIAS_GRAD]
  return x, wrt


def graph_pair(c, dtype, rng):
  """(fused outputs, float64 reference outputs): [O] + gradients."""
  x, wrt = make_inputs(c, rng)
  d_o = rng.randn(c["B"], c["G"], c["Hv"], c["N"], c["Dv"])
  with GRAPH.as_default():
    got_in = {k: tf.constant(v.astype(dtype)) for k, v in x.items()}
    # the reference runs on the same (rounded) values in float64
    want_in = {k: tf.constant(v.astype(dtype).astype(np.float64))
               for k, v in x.items()}
    outs = []
    for inputs, fused in ((got_in, True), (want_in, False)):
      args = [inputs["q"], inputs["k"], inputs["v"], inputs.get("p_l"),
              inputs.get("p_w"), inputs.get("bias")]
      if fused:
        o = ops.fused_core_with_stats(
            *args, bias_grad=c["bias"] in BIAS_GRAD,
            block_queries=c["block"])[0]
      else:
        o = reference.core(*args)
      grads = tf.gradients(tf.reduce_sum(o * tf.cast(d_o, o.dtype)),
                           [inputs[name] for name in wrt])
      outs.append([o] + grads)
  return outs, ["o"] + ["d" + name for name in wrt]


class FusedCoreTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.assertIsNotNone(MODULE, "the fused op did not load: %s" % REASON)

  @parameterized.named_parameters(
      [(name + "_" + np.dtype(dtype).name, dict(BASE, **case), dtype)
       for name, case in CASES.items()
       for dtype in (np.float32, np.float64)])
  def test_equals_reference(self, case, dtype):
    rng = np.random.RandomState(len(str(case)))
    (got, want), names = graph_pair(case, dtype, rng)
    got, want = session().run([got, want])
    self.assertEqual(len(names), len(got))
    expected = 3 + case["p_l"] + case["p_w"] + (case["bias"] in BIAS_GRAD)
    self.assertLen(names, 1 + expected)  # O and every gradient
    for name, g, w in zip(names, got, want):
      self.assertEqual(g.dtype, dtype, name)
      self.assertEqual(g.shape, w.shape, name)
      self.assertLessEqual(relative(g, w), TOLERANCE[dtype], name)

  def test_numerical_gradient(self):
    case = dict(BASE, B=2, Hk=2, H=3, Hv=2, N=5, M=4, Dk=3, Dv=2, p_l=True,
                p_w=True, bias="relative", block=2)
    x, wrt = make_inputs(case, np.random.RandomState(7))
    with GRAPH.as_default(), session().as_default():
      inputs = {k: tf.constant(v) for k, v in x.items()}
      o = ops.attention_core(inputs["q"], inputs["k"], inputs["v"],
                             inputs["p_l"], inputs["p_w"], inputs["bias"],
                             bias_grad=True)
      error = tf.test.compute_gradient_error(
          [inputs[n] for n in wrt], [x[n].shape for n in wrt], o,
          o.shape.as_list(), x_init_value=[x[n] for n in wrt], delta=1e-5)
    self.assertLess(error, 1e-8)


def _raw(q, k, v, p_l=None, p_w=None, bias=None, grad_do=None):
  """Runs the raw op (grad op when grad_do is given) on arrays through
  shapeless placeholders (so that only the kernel checks them)."""
  names = ["q", "k", "v", "p_l", "p_w", "bias"]
  values = [q, k, v, p_l, p_w, bias]
  flags = dict(has_p_l=p_l is not None, has_p_w=p_w is not None,
               has_bias=bias is not None)
  with GRAPH.as_default():
    holders = [tf.placeholder(tf.float32, name=n) for n in names]
    feed = {h: (np.zeros([0], np.float32) if x is None else
                np.asarray(x, np.float32)) for h, x in zip(holders, values)}
    if grad_do is None:
      out = MODULE.fused_attention_core(*holders, **flags)[0]
    else:
      lse, do = tf.placeholder(tf.float32), tf.placeholder(tf.float32)
      feed[lse] = np.zeros(q.shape[:4])
      feed[do] = grad_do
      out = MODULE.fused_attention_core_grad(*(holders + [lse, do]),
                                             **flags)[0]
  return session().run(out, feed)


Z = np.zeros
SHAPE_ERRORS = [
    ("q_rank", dict(q=Z([2, 1, 3, 4]), k=Z([2, 1, 3, 5, 6]),
                    v=Z([2, 1, 3, 5, 6])),
     r"q must be \[B, G, Hk, N, Dk\], got \[2,1,3,4\]"),
    ("k_d_k", dict(q=Z([2, 1, 3, 4, 6]), k=Z([2, 1, 3, 5, 7]),
                   v=Z([2, 1, 3, 5, 6])),
     r"k \[2,1,3,5,7\] does not match q \[2,1,3,4,6\] in B, G, Hk or Dk"),
    ("v_length", dict(q=Z([2, 1, 3, 4, 6]), k=Z([2, 1, 3, 5, 6]),
                      v=Z([2, 1, 3, 4, 6])),
     r"v \[2,1,3,4,6\] does not match k \[2,1,3,5,6\] in B, G or M"),
    ("p_l_groups", dict(q=Z([2, 1, 3, 4, 6]), k=Z([2, 1, 3, 5, 6]),
                        v=Z([2, 1, 4, 5, 6]), p_l=Z([2, 3, 4])),
     r"p_l must be \[G, Hk, H\] = \[1, 3, H\], got \[2,3,4\]"),
    ("p_w_heads", dict(q=Z([2, 1, 3, 4, 6]), k=Z([2, 1, 3, 5, 6]),
                       v=Z([2, 1, 4, 5, 6]), p_w=Z([1, 2, 4])),
     r"p_w must be \[G, H, Hv\] = \[1, 3, 4\], got \[1,2,4\]"),
    ("v_heads_without_p_w", dict(q=Z([2, 1, 3, 4, 6]), k=Z([2, 1, 3, 5, 6]),
                                 v=Z([2, 1, 4, 5, 6])),
     r"without p_w, v's heads \(4\) must equal the logits' heads H \(3\)"),
    ("bias_heads", dict(q=Z([2, 1, 3, 4, 6]), k=Z([2, 1, 3, 5, 6]),
                        v=Z([2, 1, 3, 5, 6]), bias=Z([1, 2, 4, 5])),
     r"bias must be \[1 or B, 1 or G\*H, N, M\] = \[1 or 2, 1 or 3, 4, 5\], "
     r"got \[1,2,4,5\]"),
    ("bias_length", dict(q=Z([2, 1, 3, 4, 6]), k=Z([2, 1, 3, 5, 6]),
                         v=Z([2, 1, 3, 5, 6]), bias=Z([2, 3, 4, 4])),
     r"bias must be .* got \[2,3,4,4\]"),
    ("grad_do_shape", dict(q=Z([2, 1, 3, 4, 6]), k=Z([2, 1, 3, 5, 6]),
                           v=Z([2, 1, 3, 5, 6]), grad_do=Z([2, 1, 3, 4, 5])),
     r"do must be O's shape \[2,1,3,4,6\], got \[2,1,3,4,5\]"),
]


class ShapeErrorTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.assertIsNotNone(MODULE, "the fused op did not load: %s" % REASON)

  @parameterized.named_parameters(*SHAPE_ERRORS)
  def test_kernel_refuses(self, arrays, message):
    with self.assertRaises(tf.errors.InvalidArgumentError) as e:
      _raw(**arrays)
    # TF adds the node's traceback around the kernel's one line
    (line,) = [l for l in e.exception.message.splitlines()
               if l.startswith("fused attention core: ")]
    self.assertRegex(line, "^fused attention core: .*%s$" % message)

  def test_python_refuses_mixed_dtypes_and_bias_grad_without_bias(self):
    with GRAPH.as_default():
      q = tf.zeros([1, 1, 2, 3, 4])
      with self.assertRaisesRegex(ValueError, "p_l is float64 but q is "
                                  "float32; cast them to one dtype"):
        ops.attention_core(q, q, q, p_l=tf.zeros([1, 2, 2], tf.float64))
      with self.assertRaisesRegex(ValueError, "bias_grad=True needs a bias"):
        ops.attention_core(q, q, q, bias_grad=True)
      with self.assertRaisesRegex(ValueError, "float32 or float64, got "
                                  "float16"):
        h = tf.zeros([1, 1, 2, 3, 4], tf.float16)
        ops.attention_core(h, h, h)


# ------------------------------------------- 4. building, no compiler
def _fake_compiler(tmp_path, compiles):
  """A `compiler` that answers --version and fails (or not) to compile."""
  path = tmp_path / "fake-c++"
  path.write_text(
      "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'fake c++ 1.0'; "
      "exit 0; fi\n" + ("exit 0\n" if compiles else
                        "echo 'fused_core.cc:1:1: error: fake failure' >&2\n"
                        "exit 1\n"))
  path.chmod(0o755)
  return str(path)


def test_without_a_compiler_load_returns_none_and_one_line(tmp_path):
  missing = str(tmp_path / "no-such-c++")
  script = ("from mtf_talking_heads.nn.fused import ops\n"
            "m, r = ops.load()\nm2, r2 = ops.load()\n"
            "print(m is None, m2 is None, r == r2)\nprint(r)\n")
  env = dict(os.environ, CXX=missing, MTF_TH_OPS_DIR=str(tmp_path / "ops"),
             TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, env=env, cwd=str(REPO), timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  assert lines[-2] == "True True True"
  assert lines[-1] == (
      "no C++ compiler: %r ($CXX) not found; install g++ or set CXX to a "
      "C++ compiler" % missing)
  assert not (tmp_path / "ops").exists() or not list(
      (tmp_path / "ops").glob("*.so"))


def test_build_command_says_why_in_one_line(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("CXX", "/bin/false")
  monkeypatch.setenv("MTF_TH_OPS_DIR", str(tmp_path))
  assert build.main() == 1
  err = capsys.readouterr().err.strip()
  assert err == ("fused attention core not built: C++ compiler '/bin/false': "
                 "`--version` failed (exit 1); set CXX to a working C++ "
                 "compiler")
  module, reason = ops._load()  # pylint: disable=protected-access
  assert module is None and reason == err[len("fused attention core not "
                                              "built: "):]


def test_a_failed_compile_is_one_line_and_leaves_no_file(tmp_path,
                                                        monkeypatch):
  monkeypatch.setenv("CXX", _fake_compiler(tmp_path, compiles=False))
  monkeypatch.setenv("MTF_TH_OPS_DIR", str(tmp_path / "ops"))
  with pytest.raises(build.BuildError) as e:
    build.build()
  assert str(e.value) == (
      "compiling fused_core.cc with %s failed (exit 1): fused_core.cc:1:1: "
      "error: fake failure" % (tmp_path / "fake-c++"))
  assert [p.name for p in (tmp_path / "ops").iterdir()] == [
      os.path.basename(build.plan()[0]) + ".lock"]


def test_the_library_name_changes_with_source_and_compiler(tmp_path,
                                                           monkeypatch):
  monkeypatch.setenv("MTF_TH_OPS_DIR", str(tmp_path))
  first, command = build.plan()
  assert os.path.dirname(first) == str(tmp_path)
  assert command[1:5] == list(build.CXX_FLAGS)
  edited = tmp_path / "fused_core.cc"
  edited.write_bytes(open(build.SOURCE, "rb").read() + b"// edited\n")
  monkeypatch.setattr(build, "SOURCE", str(edited))
  second = build.plan()[0]
  monkeypatch.setenv("CXX", _fake_compiler(tmp_path, compiles=True))
  third = build.plan()[0]
  assert len({first, second, third}) == 3
