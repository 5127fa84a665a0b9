"""The fused attention core: a TensorFlow custom op (C++, CPU) for O from Q, K, V.

ops.py loads (building when needed) the op and gives its Python function;
reference.py is the same function in plain TF einsums (the interface's
definition and the tests' reference).
"""
