"""The one place where the old mesh-tensorflow / t5 stack is mended.

Importing this module (which ``import mtf_talking_heads`` does first) applies
every fix below, so our code, mtf's own modules and the stock
``t5_mesh_transformer --module_import=mtf_talking_heads`` all work on the
pinned stack (TF 2.15.1, mesh-tensorflow 0.1.21, t5 0.9.4).  Each fix names
the upstream breakage it works around; see also ../shared/stack/README.md.
"""
import os
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
from tensorflow.python.framework import ops as _tf_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import tensor_conversion_registry as _tcr  # pylint: disable=g-direct-tensorflow-import


def _fix_register_tensor_conversion_function():
  """Breakage 1: mtf's tpu_variables.py calls ops.register_tensor_conversion_function.

  TF >= 2.13 moved it to tensor_conversion_registry, so `import
  mesh_tensorflow` raises AttributeError (tensorflow/mesh issues #392, #396).
  """
  if not hasattr(_tf_ops, "register_tensor_conversion_function"):
    _tf_ops.register_tensor_conversion_function = (
        _tcr.register_tensor_conversion_function)


def _fix_t5_hf_model_import():
  """Breakage 2: `import t5.models` imports t5.models.hf_model, which needs torch.

  We never use the HuggingFace path; a stand-in module keeps 0.9 GB of torch
  out of the install.  A real torch, if installed, is left alone.
  """
  name = "t5.models.hf_model"
  if name in sys.modules:
    return
  try:
    import torch  # pylint: disable=g-import-not-at-top,unused-import
    return
  except ImportError:
    pass
  stub = types.ModuleType(name)

  class HfPyTorchModel(object):  # pylint: disable=too-few-public-methods

    def __init__(self, *args, **kwargs):
      raise ImportError("t5's HfPyTorchModel needs torch, which "
                        "mtf_talking_heads does not install; use MtfModel.")

  stub.HfPyTorchModel = HfPyTorchModel
  sys.modules[name] = stub


def estimator_session_config(num_cpu_devices, base=None):
  """Breakage 3: Estimator's default session config exposes only CPU:0.

  With soft placement every logical CPU device then silently lands on CPU:0.
  Returns a ConfigProto whose device_count["CPU"] covers all logical devices.

  Args:
    num_cpu_devices: an integer, number of logical CPU devices.
    base: an optional tf.ConfigProto to extend.
  Returns:
    a tf.ConfigProto
  """
  config = tf.ConfigProto() if base is None else base
  config.device_count["CPU"] = max(int(num_cpu_devices), 1)
  config.allow_soft_placement = True
  return config


_LOGICAL_CPUS = []


def split_cpu(num_devices):
  """Breakage 4: logical CPU devices must be configured before any op runs.

  Splits the host CPU into `num_devices` logical devices (idempotent; a
  second call asking for a different number raises a clear error).

  Args:
    num_devices: an integer >= 1.
  Returns:
    a list of device strings, e.g. ["/job:localhost/replica:0/task:0/device:CPU:0", ...]
  Raises:
    ValueError: if the CPU was already split into a different number.
  """
  import tensorflow as tf2  # pylint: disable=g-import-not-at-top
  if num_devices < 1:
    raise ValueError("num_devices must be >= 1, got %d" % num_devices)
  if _LOGICAL_CPUS:
    if len(_LOGICAL_CPUS) < num_devices:
      raise ValueError(
          "The CPU was already split into %d logical devices in this process; "
          "%d are needed. Start a new process (or split once into the "
          "largest number you need)." % (len(_LOGICAL_CPUS), num_devices))
    return _LOGICAL_CPUS[:num_devices]
  cpu = tf2.config.list_physical_devices("CPU")[0]
  existing = tf2.config.get_logical_device_configuration(cpu)
  if existing is None or len(existing) < num_devices:
    try:
      tf2.config.set_logical_device_configuration(
          cpu, [tf2.config.LogicalDeviceConfiguration()] * num_devices)
    except RuntimeError as e:
      raise ValueError(
          "Cannot split the CPU into %d logical devices: TensorFlow is already "
          "initialised in this process (%s). Split before building any graph."
          % (num_devices, e))
    existing = num_devices
  else:
    existing = len(existing)
  _LOGICAL_CPUS.extend(
      "/job:localhost/replica:0/task:0/device:CPU:%d" % i
      for i in range(existing))
  return _LOGICAL_CPUS[:num_devices]


def apply():
  _fix_register_tensor_conversion_function()
  _fix_t5_hf_model_import()


apply()
