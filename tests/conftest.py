"""Session-wide set-up: the CPU is split into 8 logical devices before any
TensorFlow op runs (it can only be done once per process), so every test
module can use meshes of up to 8 devices with PlacementMeshImpl."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mtf_talking_heads import compat  # noqa: E402  (fixes mtf imports)

NUM_DEVICES = 8
compat.split_cpu(NUM_DEVICES)
