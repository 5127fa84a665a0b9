"""launch/tpu.py checks before it creates anything, and ships only what a worker needs.

The script runs in-process (its main(argv)), so TensorFlow and the package
are imported once; gcloud is never run: subprocess.run is replaced by a
recorder.
"""
import importlib.util
import os
import tarfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENT = "experiments/t5_heads/07_talking_heads_24_32.gin"  # 24 heads


def _load():
  spec = importlib.util.spec_from_file_location(
      "launch_tpu", os.path.join(REPO, "launch", "tpu.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


tpu = _load()


def _argv(accelerator, parallelism="model", experiment=EXPERIMENT,
          dry_run=True):
  return (["--dry_run"] if dry_run else []) + [
      "--name", "th24", "--zone", "europe-west4-a", "--project", "proj",
      "--model_dir", "gs://bucket/runs/th24", "--experiment", experiment,
      "--accelerator", accelerator, "--parallelism", parallelism]


@pytest.fixture
def gcloud(monkeypatch):
  """Records the commands main() would run instead of running them."""
  calls = []

  def run(cmd, check=False):
    calls.append((list(cmd), os.path.exists(tpu.tarball_path(
        type("A", (), {"name": "th24"})))))
  monkeypatch.setattr(tpu.subprocess, "run", run)
  return calls


def test_heads_that_do_not_split_over_the_mesh_fail_the_dry_run(capsys):
  # 24 heads on model:32 (v3-32, --parallelism model): mtf_th train's check
  assert tpu.main(_argv("v3-32", "model")) == 2
  out = capsys.readouterr()
  assert out.out == ""
  (line,) = out.err.strip().splitlines()
  assert "'heads' (size 24)" in line and "model:32" in line
  assert "pre-flight" in line


@pytest.mark.parametrize("accelerator, words", [
    ("v9-8", ["v9", "v3-{8,32"]),
    ("v3-16", ["v3 slices have 8, 32"]),
    ("v5litepod-8", ["not a TPU type"]),
    ("gpu", ["not a TPU type"]),
])
def test_unknown_accelerator_types_are_refused(accelerator, words, capsys):
  assert tpu.main(_argv(accelerator)) == 2
  out = capsys.readouterr()
  (line,) = out.err.strip().splitlines()
  assert "--accelerator" in line
  for word in words:
    assert word in line, line
  assert out.out == ""


def test_a_missing_experiment_file_is_refused(capsys):
  assert tpu.main(_argv("v3-8", experiment="experiments/t5_heads/99_no.gin")) == 2
  out = capsys.readouterr()
  (line,) = out.err.strip().splitlines()
  assert "99_no.gin" in line and "no such file" in line
  assert out.out == ""


def test_valid_slice_prints_five_commands_and_ships_a_tarball(capsys, gcloud):
  assert tpu.main(_argv("v3-32", "mixed")) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 5 and not gcloud
  assert 'mesh_shape = "batch:4,model:8"' in lines[3]
  scp = lines[1].split()
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert scp[5].endswith(".tar.gz") and REPO not in lines[1]
  assert "--recurse" not in scp
  assert "tar -xzf ~/mtf_talking_heads.tar.gz" in lines[2]


def test_real_run_creates_nothing_when_the_pre_flight_fails(capsys, gcloud):
  assert tpu.main(_argv("v3-32", "model", dry_run=False)) == 2
  assert gcloud == []


def test_real_run_packs_before_copying(capsys, gcloud):
  path = tpu.tarball_path(type("A", (), {"name": "th24"}))
  if os.path.exists(path):
    os.remove(path)
  try:
    assert tpu.main(_argv("v3-8", "model", dry_run=False)) == 0
    assert [c[0][4] for c in gcloud] == ["create", "scp", "ssh", "ssh",
                                        "ssh"]
    assert [exists for _, exists in gcloud] == [False, True, True, True, True]
  finally:
    if os.path.exists(path):
      os.remove(path)


def test_the_tarball_holds_what_a_worker_needs_and_no_venv_or_caches(
    tmp_path):
  names = tpu.pack(str(tmp_path / "ship.tar.gz"))
  for needed in ("setup.py", "requirements.lock", "MANIFEST.in",
                 "mtf_talking_heads_startup.py",
                 "mtf_talking_heads/__init__.py",
                 "mtf_talking_heads/training/__init__.py", "gin/mtf_th.gin",
                 "gin/" + EXPERIMENT):
    assert needed in names, needed
  top = {n.split("/")[0] for n in names}
  assert top == {"mtf_talking_heads", "mtf_talking_heads_startup.py",
                 "setup.py", "MANIFEST.in", "requirements.lock", "gin"}
  assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
  with tarfile.open(str(tmp_path / "ship.tar.gz")) as tar:
    size = sum(m.size for m in tar.getmembers())
  assert size < 20e6, size  # the checkout's .venv alone is ~2.8 GB
