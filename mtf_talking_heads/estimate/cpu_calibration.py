"""This machine's figures for `mtf_th perf --hardware cpu`.

Written by benchmarks/calibrate_cpu.py --write; do not edit by hand.
"""

CPU = {
    "matmul_flops": 1.012e+11,
    "memory_bytes_per_s": 1.486e+10,
    "measured": '2026-11-26',
    "cpu": 'AMD EPYC',
    "cores": 2,
    "load_average": (5.37, 5.27, 3.33),
    "command": "benchmarks/calibrate_cpu.py --write",
}
