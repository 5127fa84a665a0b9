"""Estimators without TensorFlow: counts, prices, step time, memory, plans.

strategy_table (the strategy names), costs (the paper's parameter and
multiply formulas), prices (each strategy's communication), hardware (the
catalogue and implementations), model (the Model a step is priced for,
read from gin files as text), step_time (the roofline model), paper (the
paper's step times), memory, planner, auto_pricing and fit_check.  They
import only core and each other; never TensorFlow, never nn.
"""
