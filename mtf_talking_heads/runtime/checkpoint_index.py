"""A checkpoint's files checked without TensorFlow, and stale save folders.

TF's Saver (V2 format) writes a checkpoint model.ckpt-N as

  model.ckpt-N.index                 an SSTable (LevelDB's table format):
      data blocks of (tensor name -> BundleEntryProto: shard_id, offset,
      size, ...) and (b"" -> BundleHeaderProto: num_shards), an index
      block, a 48-byte footer ending in the magic 0xdb4775248b80fb57; every
      block followed by a type byte and its masked CRC-32C
  model.ckpt-N.data-K-of-M           the tensors' bytes, at those offsets

A sharded save first writes model.ckpt-N_temp/part-* and then merges them
into model.ckpt-N and removes the folder; a save killed half-way (SIGKILL,
power) leaves model.ckpt-N_temp/ behind.

damage(prefix) reads the index whole (its checksums, its entries) and
compares every data shard's length with the entries; TensorFlow itself
would stop with "file is too short to be an sstable" or "Read less bytes
than requested" (a traceback, or a failing restore op after the graph is
built).  Imports only the standard library: the commands check before
TensorFlow loads.

Example:
  damage("/tmp/run/model.ckpt-4") == None            # sound
  damage("/tmp/run/model.ckpt-4") == "model.ckpt-4.index is empty"
  stale_temp_dirs("/tmp/run", saved_step=6) == ["/tmp/run/model.ckpt-4_temp"]
"""
import glob
import os
import re
import shutil
import struct

MAGIC = 0xdb4775248b80fb57
FOOTER_BYTES = 48
_TEMP = re.compile(r"model\.ckpt-(\d+)_temp\Z")


class _Bad(ValueError):
  """The index is not what TF's BundleWriter writes (message: why)."""


def _crc32c_table():
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82f63b78 if crc & 1 else 0)
    table.append(crc)
  return table


_CRC_TABLE = _crc32c_table()


def crc32c(data):
  """CRC-32C (Castagnoli) of bytes, as TF's crc32c::Value.

  Example: crc32c(b"123456789") == 0xe3069283
  """
  crc = 0xffffffff
  table = _CRC_TABLE
  for byte in data:
    crc = table[(crc ^ byte) & 0xff] ^ (crc >> 8)
  return crc ^ 0xffffffff


def _unmask(masked):
  rot = (masked - 0xa282ead8) & 0xffffffff
  return ((rot >> 17) | (rot << 15)) & 0xffffffff


def _varint(buf, pos):
  result = shift = 0
  while True:
    if pos >= len(buf):
      raise _Bad("a number runs past its end")
    byte = buf[pos]
    pos += 1
    result |= (byte & 0x7f) << shift
    if byte < 0x80:
      return result, pos
    shift += 7
    if shift > 63:
      raise _Bad("a number is too long")


def _block(data, handle):
  """The contents of the block at handle (offset, size), checksum checked;
  None for a compressed block (not read here)."""
  offset, size = handle
  end = offset + size
  if end + 5 > len(data):
    raise _Bad("a block runs past the end of the file")
  contents = data[offset:end]
  kind = data[end]
  stored, = struct.unpack("<I", data[end + 1:end + 5])
  if _unmask(stored) != crc32c(contents + bytes([kind])):
    raise _Bad("a block's checksum does not match its bytes")
  return contents if kind == 0 else None


def _entries(block):
  """(key, value) of a block (prefix-compressed keys, restart array)."""
  if len(block) < 4:
    raise _Bad("a block is too short")
  restarts, = struct.unpack("<I", block[-4:])
  limit = len(block) - 4 - 4 * restarts
  if limit < 0:
    raise _Bad("a block's restart array is too long")
  pos, key = 0, b""
  while pos < limit:
    shared, pos = _varint(block, pos)
    fresh, pos = _varint(block, pos)
    size, pos = _varint(block, pos)
    if shared > len(key) or pos + fresh + size > limit:
      raise _Bad("an entry runs past its block")
    key = key[:shared] + block[pos:pos + fresh]
    pos += fresh
    yield key, block[pos:pos + size]
    pos += size


def _fields(message):
  """{field number: last varint value} of a protobuf message."""
  out, pos = {}, 0
  while pos < len(message):
    tag, pos = _varint(message, pos)
    number, wire = tag >> 3, tag & 7
    if wire == 0:
      out[number], pos = _varint(message, pos)
    elif wire == 1:
      pos += 8
    elif wire == 2:
      size, pos = _varint(message, pos)
      pos += size
    elif wire == 5:
      pos += 4
    else:
      raise _Bad("an entry is not a protobuf message")
    if pos > len(message):
      raise _Bad("an entry runs past its end")
  return out


def read_index(data):
  """The shard count and entries of a checkpoint index's bytes.

  Returns:
    (num_shards, {tensor name: (shard_id, offset, size)}); entries of
    compressed blocks (never written by TF's BundleWriter) are left out.
  Raises:
    ValueError: why the bytes are not an index (one phrase).
  """
  if not data:
    raise _Bad("it is empty")
  if len(data) < FOOTER_BYTES:
    raise _Bad("it is %d bytes, shorter than an index's %d-byte footer"
               % (len(data), FOOTER_BYTES))
  magic, = struct.unpack("<Q", data[-8:])
  if magic != MAGIC:
    raise _Bad("its last 8 bytes are not an index's footer (cut short, or "
               "not an index)")
  footer = data[-FOOTER_BYTES:]
  pos = 0
  for _ in range(2):  # the metaindex block's handle, then the index's
    offset, pos = _varint(footer, pos)
    size, pos = _varint(footer, pos)
  index = _block(data, (offset, size))
  num_shards, entries = None, {}
  for _, handle in _entries(index or b"\0\0\0\0"):
    block_offset, at = _varint(handle, 0)
    block_size, _ = _varint(handle, at)
    block = _block(data, (block_offset, block_size))
    for key, value in _entries(block or b"\0\0\0\0"):
      fields = _fields(value)
      if key == b"":
        num_shards = fields.get(1, 1)
      else:
        entries[key.decode("utf-8", "replace")] = (
            fields.get(3, 0), fields.get(4, 0), fields.get(5, 0))
  if num_shards is None and index is not None:
    raise _Bad("it has no header entry")
  return num_shards, entries


def damage(prefix):
  """Why the checkpoint `prefix` (model_dir/model.ckpt-N) cannot be read,
  or None: its index is missing, empty, cut or garbled, or a data shard is
  missing or shorter than the index says (cut).  Reads the index whole
  and stats the shards; a gs:// prefix is not checked (None).

  Example:
    damage(d + "/model.ckpt-4") == ("model.ckpt-4.data-00001-of-00002 is "
        "1000 bytes, but its index places tensors up to byte 271360")
  """
  if "://" in prefix:
    return None
  name = os.path.basename(prefix)
  index = prefix + ".index"
  try:
    with open(index, "rb") as f:
      data = f.read()
  except IsADirectoryError:
    return "%s.index is a folder, not a file" % name
  except OSError as e:
    return "%s.index cannot be read (%s)" % (name, e.strerror or e)
  try:
    num_shards, entries = read_index(data)
  except ValueError as e:
    return "%s.index is damaged: %s" % (name, e)
  if num_shards is None:
    return None
  ends = {}
  for shard, offset, size in entries.values():
    ends[shard] = max(ends.get(shard, 0), offset + size)
  for shard in range(num_shards):
    data_name = "%s.data-%05d-of-%05d" % (name, shard, num_shards)
    try:
      length = os.stat(os.path.join(os.path.dirname(prefix),
                                    data_name)).st_size
    except OSError:
      return "%s is missing (its index names %d data files)" % (data_name,
                                                               num_shards)
    if length < ends.get(shard, 0):
      return ("%s is %d bytes, but its index places tensors up to byte %d "
              "(cut short)" % (data_name, length, ends[shard]))
  return None


def stale_temp_dirs(model_dir, saved_step):
  """The model.ckpt-N_temp folders that the save of `saved_step` supersedes
  (N <= saved_step): what a killed save of step N left behind.  A folder of
  a later step is left alone (that save may come again)."""
  if "://" in model_dir:
    return []
  out = []
  for path in glob.glob(os.path.join(glob.escape(model_dir),
                                     "model.ckpt-*_temp")):
    match = _TEMP.match(os.path.basename(path))
    if match and int(match.group(1)) <= saved_step and os.path.isdir(path):
      out.append(path)
  return sorted(out)


def remove_stale_temps(model_dir, saved_step):
  """Removes stale_temp_dirs(model_dir, saved_step); returns their paths."""
  removed = stale_temp_dirs(model_dir, saved_step)
  for path in removed:
    shutil.rmtree(path, ignore_errors=True)
  return removed
