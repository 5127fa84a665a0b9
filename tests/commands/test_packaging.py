"""The lock file that `make` installs agrees with the pins of setup.py."""
import ast
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


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


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory):
  """(the wheel of `pip wheel .`, the folder `pip install --target` made)."""
  tmp_path = tmp_path_factory.mktemp("wheel")
  pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
  subprocess.run(pip + ["wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path), str(REPO)],
                 check=True, capture_output=True, timeout=300)
  (wheel,) = tmp_path.glob("mtf_talking_heads-*.whl")
  site = tmp_path / "site"
  subprocess.run(pip + ["install", "-q", "--no-deps", "--target", str(site),
                        str(wheel)], check=True, capture_output=True,
                 timeout=300)
  return wheel, site


@pytest.fixture(scope="module")
def wheel_imports(installed_wheel, tmp_path_factory):
  """What a fresh Python with only the installed wheel on its path prints
  for models.gin_dir(), sweep.__file__ and training.__file__ (one process:
  the package imports TensorFlow)."""
  _, site = installed_wheel
  return subprocess.run(
      [sys.executable, "-c",
       "from mtf_talking_heads import training; "
       "from mtf_talking_heads.experiments import sweep; "
       "from mtf_talking_heads.nn import models; "
       "print(models.gin_dir()); print(sweep.__file__); "
       "print(training.__file__)"],
      cwd=str(tmp_path_factory.mktemp("elsewhere")),
      env=dict(os.environ, PYTHONPATH=str(site)),
      capture_output=True, text=True, timeout=300)


def test_a_wheel_carries_the_gin_files(installed_wheel, wheel_imports):
  """pip install . (not -e) still finds gin/ (as mtf_talking_heads/gin)."""
  wheel, site = installed_wheel
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
  shipped = {n[len("mtf_talking_heads/gin/"):] for n in names
             if n.startswith("mtf_talking_heads/gin/")}
  in_repo = {str(p.relative_to(REPO / "gin")) for p in
             (REPO / "gin").rglob("*.gin")}
  assert shipped == in_repo
  found = wheel_imports
  assert found.stdout.strip().splitlines()[-3] == str(
      site / "mtf_talking_heads" / "gin"), found.stderr[-2000:]


def test_a_wheel_carries_every_module_and_subpackage(installed_wheel,
                                                     wheel_imports):
  """Every .py file of mtf_talking_heads/ (sweep/, training/, ...) ships, and
  the installed wheel imports sweep and training as packages."""
  wheel, site = installed_wheel
  with zipfile.ZipFile(wheel) as z:
    shipped = {n for n in z.namelist() if n.endswith(".py")}
  in_repo = {str(p.relative_to(REPO)) for p in
             (REPO / "mtf_talking_heads").rglob("*.py")}
  assert in_repo - shipped == set()
  assert {"mtf_talking_heads/experiments/sweep/__init__.py",
          "mtf_talking_heads/training/__init__.py"} <= shipped
  found = wheel_imports
  assert found.returncode == 0, found.stderr[-2000:]
  assert found.stdout.splitlines()[-2:] == [
      str(site / "mtf_talking_heads" / "experiments" / "sweep" / "__init__.py"),
      str(site / "mtf_talking_heads" / "training" / "__init__.py")]


PTH = "mtf_talking_heads_startup.pth"
PTH_LINE = ("import mtf_talking_heads_startup; "
            "mtf_talking_heads_startup.install()\n")


def test_a_wheel_installs_the_startup_hook_and_it_mends_mtf(installed_wheel,
                                                            tmp_path):
  """The wheel's .pth makes `import mesh_tensorflow` work in a fresh Python.

  (`t5_mesh_transformer` imports mesh_tensorflow before --module_import.)
  """
  wheel, site = installed_wheel
  with zipfile.ZipFile(wheel) as z:
    assert z.read(PTH).decode() == PTH_LINE
    assert "mtf_talking_heads_startup.py" in z.namelist()
  # -S: no site-packages processing, so only the wheel's .pth (addsitedir)
  # can mend mtf; the venv's packages come on sys.path without their .pth.
  venv_site = [p for p in sys.path if p.endswith("site-packages")][0]
  script = ("import site, sys; sys.path.append(%r); site.addsitedir(%r); "
            "import mesh_tensorflow, mtf_talking_heads_startup as s; "
            "print(s.__file__); "
            "print(sys.modules['mtf_talking_heads.core.compat'].__file__)"
            % (venv_site, str(site)))
  # (a PYTHONPATH, e.g. a worktree's, would put its modules before the wheel's)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  proc = subprocess.run([sys.executable, "-S", "-c", script],
                        cwd=str(tmp_path), capture_output=True, text=True,
                        env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  startup, compat = proc.stdout.splitlines()[-2:]
  assert startup.startswith(str(site)) and compat.startswith(str(site))


def test_an_editable_install_installs_the_startup_hook(tmp_path):
  """`pip install -e .` (the Makefile) gets the same .pth file."""
  script = ("import setuptools.build_meta as b; "
            "print(b.build_editable(%r))" % str(tmp_path))
  proc = subprocess.run([sys.executable, "-c", script], cwd=str(REPO),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  (wheel,) = tmp_path.glob("mtf_talking_heads-*.whl")
  with zipfile.ZipFile(wheel) as z:
    assert z.read(PTH).decode() == PTH_LINE
    finder = [n for n in z.namelist() if n.endswith("_finder.py")]
    mapping = z.read(finder[0]).decode() if finder else ""
  assert "'mtf_talking_heads_startup'" in mapping


def test_the_startup_hook_costs_nothing_without_mesh_tensorflow():
  """Python start-up (with the installed .pth) imports nothing heavy."""
  proc = subprocess.run(
      [sys.executable, "-X", "importtime", "-c",
       "import sys; print(sorted(m for m in sys.modules if m.startswith("
       "('tensorflow', 'mesh_tensorflow', 'mtf_talking_heads', 'gin'))))"],
      capture_output=True, text=True, timeout=120)
  assert proc.stdout.strip() == "['mtf_talking_heads_startup']", proc.stdout
  (ours,) = [l for l in proc.stderr.splitlines()
              if l.endswith(" mtf_talking_heads_startup")]
  assert int(ours.split("|")[1]) < 20000, ours  # cumulative microseconds
