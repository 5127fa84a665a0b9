"""The lock file that `make` installs agrees with the pins of setup.py."""
import ast
import os
import pathlib
import subprocess
import sys
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]


def _setup_pins():
  tree = ast.parse((REPO / "setup.py").read_text())
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign) and node.targets[0].id == "INSTALL_REQUIRES":
      return ast.literal_eval(node.value)
  raise AssertionError("setup.py has no INSTALL_REQUIRES")


def _normalise(requirement):
  name, version = requirement.split("==")
  name = name.split("[")[0].lower().replace("_", "-")
  return name, version


def _lock():
  lines = (REPO / "requirements.lock").read_text().splitlines()
  return dict(_normalise(l) for l in lines if l and not l.startswith("#"))


def test_every_setup_pin_is_in_the_lock_with_the_same_version():
  # pip freeze leaves out setuptools unless --all is given; a lock without it
  # builds a venv whose console scripts fail on the setuptools==80.9.0 pin.
  lock = _lock()
  for requirement in _setup_pins():
    name, version = _normalise(requirement)
    assert lock.get(name) == version, (
        f"requirements.lock pins {name}=={lock.get(name)}, setup.py {version}")


def test_every_pin_is_exact():
  for requirement in _setup_pins():
    assert "==" in requirement, f"setup.py pin {requirement!r} is not exact"


def test_a_wheel_carries_the_gin_files(tmp_path):
  """pip install . (not -e) still finds gin/ (as mtf_talking_heads/gin)."""
  pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
  subprocess.run(pip + ["wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path), str(REPO)],
                 check=True, capture_output=True, timeout=300)
  (wheel,) = tmp_path.glob("mtf_talking_heads-*.whl")
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
  shipped = {n[len("mtf_talking_heads/gin/"):] for n in names
             if n.startswith("mtf_talking_heads/gin/")}
  in_repo = {str(p.relative_to(REPO / "gin")) for p in
             (REPO / "gin").rglob("*.gin")}
  assert shipped == in_repo
  site = tmp_path / "site"
  subprocess.run(pip + ["install", "-q", "--no-deps", "--target", str(site),
                        str(wheel)], check=True, capture_output=True,
                 timeout=300)
  found = subprocess.run(
      [sys.executable, "-c",
       "from mtf_talking_heads import models; print(models.gin_dir())"],
      cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=str(site)),
      capture_output=True, text=True, timeout=300)
  assert found.stdout.strip().splitlines()[-1] == str(
      site / "mtf_talking_heads" / "gin"), found.stderr[-2000:]
