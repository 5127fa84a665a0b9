"""The split strategies' cores again, with TF's oneDNN kernels forced on.

TF 2.15 picks oneDNN by default on CPUs with AVX-512 (off on older ones),
and its Softmax refuses tensors of more than 5 dims (docs/sharding.md), so
the suite runs the tests of test_strategies.py that run a split core once
more under TF_ENABLE_ONEDNN_OPTS=1, in one pytest process of their own
(the variable is read when TensorFlow loads): the 768-heads training,
greedy decoding, and the batch:2 x model:4 runs of its matrix, where the
split cores have the most dims, for talking heads and dynamic projections
(multi-head's and logits-only's cores run a subset of their op types at
the same ranks) and the two strategies that run one model per mesh.  Left
out: heads-parallel runs (a 4-dim softmax), the pre-flight-only and error
tests (no kernel runs).  Those sessions keep TF's graph rewrites, as
training does (tests/_strategy_util.session_config).
tests/strategies/test_kernel_ranks.py checks the ranks of every strategy's graphs,
multi-head's and talking heads', statically in the main run.

The einsum core is pinned for that run (MTF_TH_TEST_CORE_KERNEL=einsum,
tests/conftest.py): in the main run the fused op takes talking heads' and
multi-head's cores, and it runs no TensorFlow softmax; the einsum core is
what runs where the fused op does not apply or is not built, and it is
the one whose ranks oneDNN limits.

Inside `make test` this file is one more file for the two workers (no
second pass after the first); `make test-onednn` runs it alone.
"""
import os
import re
import subprocess
import sys

import pytest

from _cli_util import REPO

SELECT = ("(batch2xmodel4 and (th- or dynamic- or batch_split_gathered or "
          "batch_query_split) and not heads_parallel) or 768_heads or "
          "greedy_decoding")
EXPECTED = 12  # tests SELECT picks (a selection that drifts is a failure)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_split_cores_under_onednn():
  env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1",
             MTF_TH_TEST_CORE_KERNEL="einsum")
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
       SELECT, os.path.join("tests", "strategies", "test_strategies.py")],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=2300)
  summary = proc.stdout.strip().splitlines()[-1] if proc.stdout else ""
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
  assert re.search(r"\b%d passed\b" % EXPECTED, summary), summary
  assert not re.search(r"failed|error|skipped", summary), summary
