"""launch/tpu.py checks before it creates anything, and ships only what a worker needs.

The script runs in-process (its main(argv)), so TensorFlow and the package
are imported once; gcloud is never run: subprocess.run is replaced by a
recorder.
"""
import os
import subprocess
import sys
import tarfile

import pytest

import _cli_util

REPO = _cli_util.REPO
EXPERIMENT = "experiments/t5_heads/07_talking_heads_24_32.gin"  # 24 heads


tpu = _cli_util.load_script(os.path.join("launch", "tpu.py"), "launch_tpu")


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



@pytest.mark.parametrize("accelerator, parallelism, mesh, image", [
    ("v3-8", "model", 'mesh_shape = "model:8"', "tpu-vm-tf-2.15.0-se"),
    ("v3-32", "mixed", 'mesh_shape = "batch:4,model:8"',
     "tpu-vm-tf-2.15.0-pod-se"),
    ("v3-32", "batch", 'mesh_shape = "batch:32"', "tpu-vm-tf-2.15.0-pod-se"),
    ("v4-8", "model", 'mesh_shape = "model:4"', "tpu-vm-tf-2.15.0-se"),
])
def test_dry_run_prints_the_commands_for_the_slice(accelerator, parallelism,
                                                   mesh, image, capsys):
  assert tpu.main(_argv(accelerator, parallelism)) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 5
  assert lines[0].startswith("gcloud compute tpus tpu-vm create th24")
  assert "--accelerator-type=%s" % accelerator in lines[0]
  assert image in lines[0]
  assert "mtf_th train --tpu=th24" in lines[3] and mesh in lines[3]
  assert "mtf_th eval --tpu=th24" in lines[4] and mesh in lines[4]
  assert 'activation_dtype = "bfloat16"' in lines[3]


def test_the_script_refuses_a_local_model_dir_as_a_command():
  """Run as users run it (its own Python): one line, status 2."""
  argv = [a if a != "gs://bucket/runs/th24" else "/local"
          for a in _argv("v3-32", "mixed")]
  bad = subprocess.run([sys.executable, os.path.join(REPO, "launch", "tpu.py")]
                       + argv, capture_output=True, text=True, timeout=60)
  assert bad.returncode == 2 and "gs://" in bad.stderr
  assert len(bad.stderr.strip().splitlines()) == 1


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
