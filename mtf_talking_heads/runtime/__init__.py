"""Run-time plumbing on the standard library only: cluster processes, the
model_dir lock, and a run's files (train_log.csv, eval_results.csv, the
checkpoints a model_dir holds).  Imports only core.
"""
