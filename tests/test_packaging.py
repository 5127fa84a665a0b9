"""The lock file that `make` installs agrees with the pins of setup.py."""
import ast
import pathlib

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
