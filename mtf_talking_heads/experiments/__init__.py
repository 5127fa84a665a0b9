"""Experiments on top of training: sweeps, comparisons of their runs,
attention-map pictures and the SOP evaluation.  The sweep and comparison
read run files as text; TensorFlow is imported only by the runs they start
and by visualize / sop_eval.
"""
