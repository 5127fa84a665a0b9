"""Measurements of real graphs: the test harness, mtf's lowering counters
(comm) and measured memory peaks (memory_measure).  Imports nn and below.
"""
