"""What a step runs on: the hardware catalogue and the implementation.

Pure Python (no TensorFlow).  Per-device figures of each --hardware name:
an mtf device, a TensorCore on TPU v2 and v3, a chip on v4 (megacore) and
v5e.  The TPU figures are public specifications (docs/costs.md cites
each); `cpu` is measured on this machine by benchmarks/calibrate_cpu.py
(stored in cpu_calibration.py).  An Implementation says how the step's
code stores and computes (bytes per element, how dynamic terms are
folded): step_time.py and memory.py read both.

Example:
  get_hardware("tpu_v3").peak_flops == 61.5e12  # per TensorCore
  implementation("mtf").activation_bytes == 2  # bfloat16
"""
import collections

Efficiency = collections.namedtuple("Efficiency",
                                    ["matmul", "memory", "network"])
Efficiency.__doc__ = """Fractions of the peak figures an op reaches.

matmul: of peak_flops in a compute-bound einsum; memory: of the HBM
bandwidth in a memory-bound op; network: of the ICI bandwidth.
"""
# The three factors of the model, fixed a priori (not fitted): a well-shaped
# bf16 matmul on a TPU reaches about half of peak once the MXU pipeline
# fill, padding and the vector work around it are paid; streaming ops reach
# most of the HBM bandwidth; collectives most of the link bandwidth.
DEFAULT_EFFICIENCY = Efficiency(matmul=0.5, memory=0.8, network=0.8)


Hardware = collections.namedtuple("Hardware", [
    "name", "peak_flops", "hbm_bytes_per_s", "ici_bytes_per_s",
    "devices_per_chip", "mxu", "source", "efficiency"])
Hardware.__doc__ = """Per-device figures (an mtf device).

Attributes:
  name: the --hardware name.
  peak_flops: peak dense matmul FLOP/s (bf16 on TPU; float32 on cpu).
  hbm_bytes_per_s: memory bandwidth.
  ici_bytes_per_s: ring bandwidth of a collective, per device.
  devices_per_chip: mtf devices per chip (the chip figures are divided).
  mxu: side of the systolic matrix unit (128 on TPU v2-v5e): an einsum's
    contraction is padded to a multiple of it (1: no padding).
  source: where the figures come from.
  efficiency: the Efficiency step_time.predict uses by default (peak
    figures need DEFAULT_EFFICIENCY; measured ones, as cpu's, are already
    achieved).
"""


def _tpu(name, chip_flops, chip_hbm, pod_allreduce, pod_chips, devices,
         source):
  """A TPU entry from per-chip figures; ICI = the pod's all-reduce
  bandwidth shared by its chips; MXU 128 x 128 (cloud.google.com/tpu/docs/
  system-architecture-tpu-vm)."""
  return Hardware(name, chip_flops / devices, chip_hbm / devices,
                  pod_allreduce / pod_chips / devices, devices, 128, source,
                  DEFAULT_EFFICIENCY)


_TPU_HARDWARE = (
    # TPU v2 (Jouppi et al. 2020, "A Domain Specific Supercomputer for
    # Training Deep Neural Networks", CACM 63(7), Table 3; cloud.google.com/
    # tpu/docs/v2 points there): 46 TFLOP/s bf16 and 700 GB/s HBM per chip,
    # 16 GiB HBM per chip (8 GiB per TensorCore), two TensorCores per chip,
    # 256-chip pods; ICI 4 links x 496 Gbit/s against v3's 4 x 656: the
    # all-reduce bandwidth is v3's per chip scaled by 496/656.
    _tpu("tpu_v2", 46e12, 700e9, 340e12 / 1024 * 256 * 496 / 656, 256, 2,
         "Jouppi et al. 2020 (CACM), Table 3"),
    # https://cloud.google.com/tpu/docs/v3: 123 TFLOP/s bf16 and HBM2
    # 900 GBps per chip, all-reduce 340 TB/s per 1024-chip pod; two
    # TensorCores per chip, each an mtf device.
    _tpu("tpu_v3", 123e12, 900e9, 340e12, 1024, 2,
         "cloud.google.com/tpu/docs/v3"),
    # https://cloud.google.com/tpu/docs/v4: 275 TFLOP/s, 1200 GBps, all-reduce
    # 1.1 PB/s per 4096-chip pod; megacore: one device per chip.
    _tpu("tpu_v4", 275e12, 1200e9, 1.1e15, 4096, 1,
         "cloud.google.com/tpu/docs/v4"),
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOP/s, 819 GBps,
    # all-reduce 51.2 TB/s per 256-chip pod (= half of the 400 GBps
    # bidirectional ICI per chip); one TensorCore per chip.
    _tpu("tpu_v5e", 197e12, 819e9, 51.2e12, 256, 1,
         "cloud.google.com/tpu/docs/v5e"),
)


Slice = collections.namedtuple("Slice", ["accelerator", "sizes",
                                         "cores_per_device"])
Slice.__doc__ = """The slices Cloud TPU offers of one generation.

Attributes:
  accelerator: the accelerator type's prefix, e.g. "v3-" (v3-32).
  sizes: the N of every accelerator type prefix + N, ascending.
  cores_per_device: N per mtf device: 1 where N counts the devices
    (v2, v3: TensorCores; v5e: chips), 2 on v4 (N counts TensorCores, a
    megacore chip of two is one device).
"""
# The accelerator types of each generation (public Cloud TPU pages):
#   v2: cloud.google.com/tpu/docs/v2 (v2-8, v2-32, v2-128, v2-256, v2-512)
#   v3: cloud.google.com/tpu/docs/v3 (v3-8, v3-32 ... v3-2048)
#   v4: cloud.google.com/tpu/docs/v4 (v4-8, v4-16 ... v4-4096; the N counts
#       TensorCores, two per megacore chip)
#   v5e: cloud.google.com/tpu/docs/v5e (v5litepod-1, -4, -8, -16, -32, -64,
#       -128, -256; the N counts chips, one TensorCore each)
# launch/tpu.py reads v2-v4 from here (v5e has no TPUEstimator runtime).
SLICES = {
    "tpu_v2": Slice("v2-", (8, 32, 128, 256, 512), 1),
    "tpu_v3": Slice("v3-", (8, 32, 64, 128, 256, 512, 1024, 2048), 1),
    "tpu_v4": Slice("v4-", (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
                    2),
    "tpu_v5e": Slice("v5litepod-", (1, 4, 8, 16, 32, 64, 128, 256), 1),
}
# `cpu`: logical CPU devices (one process, or --cluster servers).  The
# planner enumerates every divisor of the device count; above this many it
# refuses at once (as many as the largest TPU slice above has devices).
MAX_CPU_DEVICES = 4096


def slice_devices(name):
  """The mtf device counts of `name`'s slices; () for cpu (any count up to
  MAX_CPU_DEVICES).

  Example:
    slice_devices("tpu_v4") == (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
  """
  if name not in SLICES:
    get_hardware(name)  # a bad name fails naming the valid ones
    return ()
  s = SLICES[name]
  return tuple(n // s.cores_per_device for n in s.sizes)


def check_devices(name, devices):
  """Refuses a device count `name` has no slice (or logical mesh) of.

  Args:
    name: a hardware name.
    devices: mtf devices (an int, checked positive by the caller).
  Raises:
    ValueError: one line naming --devices and the valid counts.
  """
  valid = slice_devices(name)
  if not valid:
    if devices > MAX_CPU_DEVICES:
      raise ValueError(
          "--devices %d is more than the planner enumerates on cpu (at most "
          "%d logical devices); give a smaller --devices"
          % (devices, MAX_CPU_DEVICES))
    return
  if devices not in valid:
    s = SLICES[name]
    raise ValueError(
        "--devices %d: %s has no slice of %d devices; its slices have %s "
        "devices (%s%s)" % (
            devices, name, devices, ", ".join(map(str, valid)),
            "" if s.cores_per_device == 1 else "%s-N has N/%d: " % (
                s.accelerator[:-1], s.cores_per_device),
            ", ".join(s.accelerator + str(n) for n in s.sizes)))


def larger_devices(name, devices, count):
  """Up to `count` device counts above `devices` that `name` offers: its
  next slices, or on cpu doubling up to MAX_CPU_DEVICES."""
  valid = slice_devices(name)
  if valid:
    return [d for d in valid if d > devices][:count]
  out = []
  while len(out) < count and devices * 2 <= MAX_CPU_DEVICES:
    devices *= 2
    out.append(devices)
  return out


def _cpu_hardware():
  from mtf_talking_heads.estimate import cpu_calibration  # pylint: disable=g-import-not-at-top
  c = cpu_calibration.CPU
  # Logical CPU devices exchange data through memory: "ICI" = memory.
  return Hardware("cpu", c["matmul_flops"], c["memory_bytes_per_s"],
                  c["memory_bytes_per_s"], 1, 1,
                  "benchmarks/calibrate_cpu.py, %s" % c["measured"],
                  Efficiency(1.0, 1.0, 1.0))


def hardware_names():
  return tuple(h.name for h in _TPU_HARDWARE) + ("cpu",)


def get_hardware(name):
  """The Hardware called `name`.

  Raises:
    ValueError: naming --hardware and the valid names.
  """
  if isinstance(name, Hardware):
    return name
  for h in _TPU_HARDWARE:
    if h.name == name:
      return h
  if name == "cpu":
    return _cpu_hardware()
  raise ValueError("--hardware %r is unknown; choose one of: %s"
                   % (name, ", ".join(hardware_names())))


def check_efficiency(eff):
  """Raises ValueError unless every factor of `eff` is in (0, 1]."""
  for name, value in zip(Efficiency._fields, eff):
    if not isinstance(value, (int, float)) or not 0 < value <= 1:
      raise ValueError("--%s_efficiency (Efficiency.%s) must be in (0, 1], "
                       "got %r" % (name, name, value))


# ---------------------------------------------------------------------------
# Implementations: what the step's code stores and computes.

Implementation = collections.namedtuple("Implementation", [
    "name", "activation_bytes", "core_bytes", "state_bytes",
    "dynamic_einsums"])
Implementation.__doc__ = """How the step's code stores and computes things.

Attributes:
  activation_bytes: bytes per activation element (2: bfloat16).
  core_bytes: bytes per element of the n x m x heads tensors (J, L, W, U).
  state_bytes: bytes per parameter element in the optimizer update (float32
    variables and gradients).
  dynamic_einsums: how many n x m einsums a talking-heads projection with
    dynamic terms runs: "mtf" (mtf 0.1.x, which the paper used: the static
    projection is added to the first dynamic term, one einsum per dynamic
    term; this project's layers fold the same way, attention.fold_dynamic,
    costs.py's default count), "separate" (one per term plus the static one:
    the appendix A pseudocode, costs.py's fold_dynamic="none") or "folded"
    (one: costs.py's fold_dynamic="paper", the paper's multiplies column).
"""
IMPLEMENTATIONS = {
    # mesh_tensorflow 0.1.x layers on TPU as the paper ran them: bfloat16
    # activations, softmax in bfloat16 too (docs/tpu.md, stack README).
    "mtf": Implementation("mtf", 2, 2, 4, "mtf"),
    # this project's layers on TPU: bfloat16 activations, float32 logits
    # and softmax (docs/tpu.md), dynamic terms folded as mtf folds them.
    "mtf_th": Implementation("mtf_th", 2, 4, 4, "mtf"),
    # this project's layers in float32 (the CPU runs: activation_dtype
    # float32 in gin/mtf_th.gin).
    "mtf_th_float32": Implementation("mtf_th_float32", 4, 4, 4, "mtf"),
}


def implementation(impl):
  """The Implementation called `impl` (or `impl` itself).

  Raises:
    ValueError: naming --implementation and the valid names.
  """
  if isinstance(impl, Implementation):
    return impl
  if impl not in IMPLEMENTATIONS:
    raise ValueError("--implementation %r is unknown; choose one of: %s"
                     % (impl, ", ".join(IMPLEMENTATIONS)))
  return IMPLEMENTATIONS[impl]
