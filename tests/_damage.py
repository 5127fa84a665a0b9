"""Damage a file as a crash, a full disk or a hand edit would (the tests of
the one-line refusals of a model_dir's damaged files).

Example:
  cut(os.path.join(model_dir, "model.ckpt-4.index"), 0)  # empty
  flip(prefix + ".index", 5)  # one garbled byte
"""
import os


def cut(path, size):
  """Truncates `path` to `size` bytes (a write cut short)."""
  with open(path, "r+b") as f:
    f.truncate(size)


def write(path, data):
  """Replaces `path`'s bytes with `data`."""
  with open(path, "wb") as f:
    f.write(data)


def flip(path, at):
  """Flips one bit of the byte at offset `at` (a garbled byte)."""
  with open(path, "r+b") as f:
    f.seek(at)
    byte = f.read(1)
    f.seek(at)
    f.write(bytes([byte[0] ^ 0x40]))


def replace_with_folder(path):
  """Makes `path` a folder where a file was."""
  os.remove(path)
  os.makedirs(path)
