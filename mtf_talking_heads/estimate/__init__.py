"""Estimators without TensorFlow: counts, prices, step time, memory, plans.

costs (the paper's parameter and multiply formulas), prices (each strategy's
communication), the step-time model, memory, planner and fit_check.  They
import only core and each other; never TensorFlow, never nn.
"""
