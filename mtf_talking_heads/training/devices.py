"""Devices for the mesh: logical CPU devices on CPU, the slice on a TPU.

Owns mtf_th.mesh_devices (bound by gin/mtf_th.gin as utils.run.mesh_devices,
so the stock t5_mesh_transformer uses it too) and the number of logical CPU
devices a process may have.
"""
import gin
import mesh_tensorflow as mtf

from mtf_talking_heads.core import compat
from mtf_talking_heads.nn import models
from mtf_talking_heads.runtime import cluster as cluster_lib
from mtf_talking_heads.training import errors

DEFAULT_MAX_CPU_DEVICES = 64


def available_cpu_devices(max_cpu_devices=None):
  """Logical CPU devices this process has or may still create (--cluster:
  the cluster's devices)."""
  if cluster_lib.active() is not None:
    return cluster_lib.active().size
  if compat.logical_cpu_count():
    return compat.logical_cpu_count()
  if max_cpu_devices is None:
    max_cpu_devices = models.query("mtf_th.mesh_devices.max_cpu_devices",
                                   DEFAULT_MAX_CPU_DEVICES)
  return max_cpu_devices


def _tpu_flag():
  """--tpu of the stock t5_mesh_transformer, if that script is running."""
  try:
    from absl import flags  # pylint: disable=g-import-not-at-top
    return flags.FLAGS["tpu"].value if "tpu" in flags.FLAGS else None
  except Exception:  # pylint: disable=broad-except
    return None


@gin.configurable(module="mtf_th")
def mesh_devices(mesh_shape=None, max_cpu_devices=DEFAULT_MAX_CPU_DEVICES):
  """Device names for mtf's PlacementMeshImpl: one logical CPU per mesh slot.

  Bound by gin/mtf_th.gin as utils.run.mesh_devices, so the stock
  t5_mesh_transformer also places the mesh on logical CPU devices.  On a TPU
  (--tpu) returns None and SimdMeshImpl places the mesh on the slice.

  Args:
    mesh_shape: mesh shape; default: gin's utils.run.mesh_shape.
    max_cpu_devices: refuse meshes needing more logical CPU devices.
  Returns:
    a list of device strings, or None on TPU.
  Raises:
    ConfigError: if the mesh needs more devices than may exist.
  """
  if _tpu_flag():
    return None
  if cluster_lib.active() is not None:  # --cluster: see cluster.py
    return cluster_lib.active().devices()
  shape = mtf.convert_to_shape(
      mesh_shape if mesh_shape is not None else models.query(
          "utils.run.mesh_shape"))
  size = max(shape.size, 1)
  limit = available_cpu_devices(max_cpu_devices)
  if size > limit:
    raise errors.ConfigError(
        "mesh_shape %s needs %d devices but only %d logical CPU devices are "
        "available in this process: choose a smaller mesh" % (shape, size,
                                                             limit))
  try:
    return compat.split_cpu(size)
  except ValueError as e:
    raise errors.ConfigError(str(e)) from e
