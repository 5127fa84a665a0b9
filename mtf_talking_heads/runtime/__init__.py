"""Run-time plumbing on the standard library only: cluster processes, the
model_dir lock, a run's files (run_files.py: train_log.csv,
eval_results.csv, the checkpoints a model_dir holds) and progress rates and
ETAs (progress.py).  Imports only core.
"""
