"""The bottom layer: what every other package reads, with no TensorFlow.

spec (the variants, AttentionSpec, mesh and layout strings), gin_text (gin
files read as text), gin_paths and cache_paths (where files are), and compat
(the one module of mends to TensorFlow, mtf, t5 and gin; standard library at
import, TensorFlow only inside the hooks it installs).  Imports nothing else
of the package.
"""
