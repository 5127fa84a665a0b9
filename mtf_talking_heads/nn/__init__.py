"""The TensorFlow layer: the paper's attention on named mtf dims.

attention (the pseudocode), kernels, layers (the gin classes), the sharding
strategies, validation, models, optimizers, init_seeds and gin_checks.
Imports core and estimate (Auto's prices), never training or experiments.
"""
