"""Helpers of the model-identity tests: a directory's exact contents, and the
names behind runtime/identity.compress's brace notation."""
import hashlib
import itertools
import os
import re


def listing(path):
  """{relative path: (size, sha256, mtime_ns)} of every file, and
  {relative path: "dir"} of every directory, the top one included: equal
  before and after a command = it wrote, renamed and deleted nothing."""
  out = {".": "dir"}
  for root, dirs, files in os.walk(path):
    for name in dirs:
      out[os.path.relpath(os.path.join(root, name), path)] = "dir"
    for name in files:
      full = os.path.join(root, name)
      with open(full, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
      out[os.path.relpath(full, path)] = (os.path.getsize(full), digest,
                                          os.stat(full).st_mtime_ns)
  return out


def expand(text):
  """The names of compress()'s brace notation, as bash expands it.

  >>> expand("t/block_{000..002}/p_q, t/{a,b}")
  ['t/block_000/p_q', 't/block_001/p_q', 't/block_002/p_q', 't/a', 't/b']
  """
  names = []
  for item in re.split(r", (?![^{]*\})", text):
    choices = []
    for part in re.split(r"(\{[^}]*\})", item):
      if not part.startswith("{"):
        choices.append([part])
      elif ".." in part:
        first, last = part[1:-1].split("..")
        choices.append(["%0*d" % (len(first), i)
                        for i in range(int(first), int(last) + 1)])
      else:
        choices.append(part[1:-1].split(","))
    names += ["".join(c) for c in itertools.product(*choices)]
  return names
