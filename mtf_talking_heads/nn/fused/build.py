"""Compiles fused_core.cc into an op library in the cache, once per version.

The library is built with the machine's C++ compiler ($CXX, else g++)
against the installed TensorFlow's headers (tf.sysconfig's flags) into
cache_paths.ops_dir(), named after a hash of everything that decides its
bytes: the source, TensorFlow's version and flags, the compiler (its path and
`--version`), our flags and the CPU (-march=native).  A stale library is
never loaded, because any change makes a new name.  The build writes a
temporary file and renames it, under a file lock, so parallel processes
(pytest-xdist workers) build it once and never see half a file.

  python -m mtf_talking_heads.nn.fused.build
  # /home/me/.cache/mtf_talking_heads/ops/fused_core-3f1c2a9b0d4e5f61.so

`make venv` runs that command (so `make test` and `make demo` have the op
on a fresh clone); ops.load() runs build() itself when the library is
missing.
"""
import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys

from mtf_talking_heads.core import cache_paths

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "fused_core.cc")
CXX_FLAGS = ("-O3", "-march=native", "-fPIC", "-shared")
COMPILE_TIMEOUT = 1800  # seconds; about 80 s of CPU on the test machine


class BuildError(Exception):
  """The library cannot be built here; str() is one line: cause and fix."""


def compiler():
  """The C++ compiler to use: $CXX if set, else g++."""
  return os.environ.get("CXX") or "g++"


def _compiler_identity(cxx):
  """(absolute path, first line of `cxx --version`) or BuildError."""
  path = shutil.which(cxx)
  if not path:
    raise BuildError(
        "no C++ compiler: %r (%s) not found; install g++ or set CXX to a "
        "C++ compiler" % (cxx, "$CXX" if os.environ.get("CXX") else
                          "the default"))
  try:
    proc = subprocess.run([path, "--version"], capture_output=True,
                          text=True, timeout=60)
  except (OSError, subprocess.SubprocessError) as e:
    raise BuildError("C++ compiler %r does not run (%s); set CXX to a "
                     "working C++ compiler" % (path, e)) from e
  lines = proc.stdout.splitlines()
  if proc.returncode != 0 or not lines:
    raise BuildError("C++ compiler %r: `--version` failed (exit %d); set "
                     "CXX to a working C++ compiler" % (path,
                                                        proc.returncode))
  return path, lines[0]


def _cpu_flags():
  """The CPU's feature flags (what -march=native compiles for)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def _tf_flags():
  """(TensorFlow's version, compile flags, link flags)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return (tf.__version__, list(tf.sysconfig.get_compile_flags()),
          list(tf.sysconfig.get_link_flags()))


def plan():
  """(library path, compiler command) for this source, TF, compiler, CPU.

  Raises:
    BuildError: no usable compiler, or the source is missing.
  """
  try:
    with open(SOURCE, "rb") as f:
      source = f.read()
  except OSError as e:
    raise BuildError("fused_core.cc is missing (%s); reinstall the package"
                     % e) from e
  cxx, version = _compiler_identity(compiler())
  tf_version, compile_flags, link_flags = _tf_flags()
  key = hashlib.sha256()
  for part in ([source, tf_version, cxx, version, _cpu_flags(),
                platform.machine()] + list(CXX_FLAGS) + compile_flags +
               link_flags):
    key.update(part if isinstance(part, bytes) else part.encode())
    key.update(b"\0")
  path = os.path.join(cache_paths.ops_dir(),
                      "fused_core-%s.so" % key.hexdigest()[:16])
  command = ([cxx] + list(CXX_FLAGS) + [SOURCE, "-o", None] + compile_flags +
             link_flags)
  return path, command


@contextlib.contextmanager
def _locked(path):
  """An exclusive lock on `path` + ".lock" (blocks until it is free)."""
  with open(path + ".lock", "w") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _first_error(text):
  """The compiler's first error line (one line, at most 300 characters)."""
  lines = [l for l in text.splitlines() if "error" in l] or text.splitlines()
  return (lines[0] if lines else "no output").strip()[:300]


def one_line(error):
  """An exception as one line: its message's first line, or its type."""
  lines = str(error).strip().splitlines()
  return lines[0][:300] if lines else type(error).__name__


def build(log=None):
  """The cached library's path, compiling it first if it is not there.

  Args:
    log: called with one line before a compile starts (e.g. print).
  Returns:
    The absolute path of the library.
  Raises:
    BuildError: no compiler, the compile failed, or the cache is not
      writable; str() is one line.
  """
  path, command = plan()
  if os.path.exists(path):
    return path
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with _locked(path):
      if os.path.exists(path):  # another process built it meanwhile
        return path
      if log:
        log("building the fused attention core (once per TensorFlow, "
            "compiler and CPU; about a minute): %s" % path)
      tmp = "%s.tmp%d" % (path, os.getpid())
      command[command.index(None)] = tmp
      try:
        proc = subprocess.run(command, capture_output=True, text=True,
                              timeout=COMPILE_TIMEOUT)
      except subprocess.TimeoutExpired as e:
        raise BuildError("compiling fused_core.cc took over %d s; run "
                         "`python -m mtf_talking_heads.nn.fused.build` alone"
                         % COMPILE_TIMEOUT) from e
      except OSError as e:
        raise BuildError("cannot run the C++ compiler %s (%s); set CXX to a "
                         "working C++ compiler" % (command[0], e)) from e
      if proc.returncode != 0:
        if os.path.exists(tmp):
          os.remove(tmp)
        raise BuildError("compiling fused_core.cc with %s failed (exit %d): %s"
                         % (command[0], proc.returncode,
                            _first_error(proc.stderr)))
      os.replace(tmp, path)
  except OSError as e:
    raise BuildError("cannot write the op library under %s (%s); set "
                     "MTF_TH_CACHE to a writable directory"
                     % (cache_paths.ops_dir(), e)) from e
  return path


def main():
  """Builds and loads the library; prints its path (exit 0) or why not (1)."""
  try:
    path = build(log=lambda line: print(line, file=sys.stderr))
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.load_op_library(path)
  except BuildError as e:
    print("fused attention core not built: %s" % e, file=sys.stderr)
    return 1
  except Exception as e:  # pylint: disable=broad-except  (load_op_library)
    print("fused attention core built but not loadable: %s" % one_line(e),
          file=sys.stderr)
    return 1
  print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
