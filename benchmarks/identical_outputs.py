"""Outputs of `mtf_th costs`, `perf`, `plan` and `comm` on every paper table, to diff.

A refactoring that must not change behaviour records the outputs before and
checks them after:

  PYTHONPATH=$PWD .venv/bin/python benchmarks/identical_outputs.py \
      --save /tmp/mtf_th_outputs            # on the unchanged code
  PYTHONPATH=$PWD .venv/bin/python benchmarks/identical_outputs.py \
      --check /tmp/mtf_th_outputs           # after: byte-identical or exit 1

Each command's stdout, stderr and exit code go to one file per command.
`costs` runs every paper table of --paper_table (csv and md), every variant
with small dims, and refusals whose message must stay; `perf` runs every
table under gin/experiments, --compare_paper on the tables that have the
paper's step times, every hardware, two meshes and every implementation;
`plan` runs every table under gin/experiments (tpu_v3, 8 devices; csv), a
gin file with --all, a fixed mesh, a batch, every hardware, and refusals;
`comm` runs every variant and strategy on small dims (d_model 16, length 8,
batch 4) on model:2 and batch:2,model:2 (about 15 s per command: TensorFlow
lowers each strategy's graph).  --skip_comm leaves comm out (seconds).
"""
import argparse
import hashlib
import os
import subprocess
import sys

COSTS_TABLES = ('t5_heads', 't5_heads_dims', 't5_logits_weights', 'dp',
                'dp_individual')
PERF_TABLES = ('albert_heads', 'albert_logits_weights', 'bert_heads', 'dp',
               'dp_enc_only', 'dp_individual', 'encdec_heads', 'lm_heads',
               'lm_variants', 't5_enc_dec', 't5_heads', 't5_heads_dims',
               't5_logits_weights')
PERF_PAPER = ('t5_heads', 't5_heads_dims', 't5_logits_weights', 't5_enc_dec',
              'dp', 'dp_individual', 'dp_enc_only')
SMALL = ['--d_model', '16', '--length', '8']


def costs_commands():
  """Yields (name, argv) of every `mtf_th costs` run."""
  for table in COSTS_TABLES:
    for fmt in ('csv', 'md'):
      yield 'costs_%s_%s' % (table, fmt), ['costs', '--paper_table', table,
                                           '--format', fmt]
  dims = ['--heads', '4', '--d_k', '8', '--d_v', '8', '--d_model', '64',
          '--length', '16']
  for variant in ('multi_head', 'talking_heads', 'project_logits',
                  'project_weights'):
    yield 'costs_%s' % variant, ['costs', '--variant', variant] + dims
  yield 'costs_general_bilinear', ['costs', '--variant', 'general_bilinear',
                                   '--heads', '4', '--d_model', '64',
                                   '--length', '16']
  yield 'costs_err_bilinear', ['costs', '--variant', 'general_bilinear'] + dims
  yield 'costs_grouped', ['costs', '--variant', 'grouped_talking_heads',
                          '--groups', '2', '--heads', '8'] + dims[2:]
  yield 'costs_th_dims', ['costs', '--variant', 'talking_heads', '--heads_k',
                          '2', '--heads_v', '6'] + dims
  for fold in ('', '--fold_dynamic', '--unfolded'):
    yield 'costs_dynamic%s' % fold, (
        ['costs', '--variant', 'talking_heads', '--dynamic',
         'x2l,m2l,x2w,m2w'] + dims + ([fold] if fold else []))
  yield 'costs_pl_dynamic', ['costs', '--variant', 'project_logits',
                             '--dynamic', 'x2l'] + dims
  # Refusals whose one-line messages must stay as they are.
  yield 'costs_err_heads0', ['costs', '--variant', 'multi_head', '--heads',
                             '0', '--d_model', '8', '--length', '4']
  yield 'costs_err_missing', ['costs']
  yield 'costs_err_dynamic', ['costs', '--variant', 'multi_head',
                              '--dynamic', 'x2l'] + dims
  yield 'costs_err_groups', ['costs', '--variant', 'grouped_talking_heads',
                             '--groups', '3'] + dims
  yield 'costs_err_fold', ['costs', '--paper_table', 'dp', '--fold_dynamic']


def perf_commands():
  """Yields (name, argv) of every `mtf_th perf` run."""
  for table in PERF_TABLES:
    yield 'perf_%s' % table, ['perf', '--paper_table', table]
  for table in PERF_PAPER:
    yield 'perf_%s_paper' % table, ['perf', '--paper_table', table,
                                    '--compare_paper']
  for hardware in ('tpu_v4', 'tpu_v5e', 'cpu'):
    yield 'perf_hw_%s' % hardware, ['perf', '--paper_table', 't5_heads',
                                    '--hardware', hardware]
  for mesh in ('model:2', 'batch:2,model:2', 'model:8'):
    yield 'perf_mesh_%s' % mesh, ['perf', '--paper_table', 't5_heads',
                                  '--mesh_shape', mesh, '--format', 'md']
    yield 'perf_mesh_lw_%s' % mesh, ['perf', '--paper_table',
                                     't5_logits_weights', '--mesh_shape', mesh]
  for impl in ('mtf', 'mtf_th', 'mtf_th_float32'):
    yield 'perf_impl_%s' % impl, ['perf', '--paper_table', 'dp',
                                  '--implementation', impl]
  yield 'perf_gin', ['perf', '--gin_file',
                     'experiments/t5_heads/07_talking_heads_24_32.gin',
                     '--gin_file', 'layouts/heads_parallel.gin',
                     '--mesh_shape', 'model:4', '--gin_param',
                     'batch_size = 64']
  yield 'perf_err_gin', ['perf', '--gin_file', 'models/t5_tiny.gin']
  yield 'perf_err_mesh', ['perf', '--paper_table', 't5_heads',
                          '--mesh_shape', 'model:0']


PLAN_TABLES = PERF_TABLES + ('span_heads', 'scaling_d128')


def plan_commands():
  """Yields (name, argv) of every `mtf_th plan` run."""
  for table in PLAN_TABLES:
    yield 'plan_%s' % table, ['plan', '--paper_table', table, '--hardware',
                              'tpu_v3', '--devices', '8', '--format', 'csv']
  gin = ['--gin_file', 'experiments/t5_heads/07_talking_heads_24_32.gin']
  yield 'plan_gin_all', ['plan'] + gin + ['--hardware', 'tpu_v3', '--devices',
                                          '8', '--all', '--top', '0']
  yield 'plan_gin_mesh', ['plan'] + gin + ['--hardware', 'tpu_v4',
                                           '--devices', '4', '--mesh_shape',
                                           'batch:2,model:2']
  yield 'plan_gin_batch', ['plan'] + gin + ['--hardware', 'tpu_v5e',
                                            '--devices', '16', '--batch',
                                            '512', '--format', 'csv']
  yield 'plan_cpu', ['plan', '--gin_file', 'models/t5_tiny.gin', '--hardware',
                     'cpu', '--devices', '2']
  yield 'plan_nothing_fits', ['plan'] + gin + ['--hardware', 'tpu_v3',
                                               '--devices', '1', '--batch',
                                               '4096']
  yield 'plan_err_mesh', ['plan'] + gin + ['--hardware', 'tpu_v3',
                                           '--devices', '8', '--mesh_shape',
                                           'batch:2,model:2']
  yield 'plan_err_args', ['plan', '--hardware', 'tpu_v3', '--devices', '8']


def comm_commands():
  """Yields (name, argv) of every `mtf_th comm` run (small dims)."""
  dims = ['--heads', '4', '--d_k', '4', '--d_v', '4', '--batch', '4'] + SMALL
  for variant in ('multi_head', 'talking_heads', 'project_logits',
                  'project_weights'):
    yield 'comm_%s' % variant, ['comm', '--variant', variant,
                                '--mesh_shape', 'model:2'] + dims
  yield 'comm_grouped', ['comm', '--variant', 'grouped_talking_heads',
                         '--groups', '2', '--mesh_shape', 'model:2'] + dims
  yield 'comm_dynamic_2d', ['comm', '--variant', 'talking_heads', '--dynamic',
                            'x2l,m2w', '--mesh_shape', 'batch:2,model:2',
                            '--strategy', 'heads_parallel'] + dims
  yield 'comm_auto', ['comm', '--variant', 'talking_heads', '--mesh_shape',
                      'model:2', '--strategy', 'auto', '--heads_v', '2'] + dims
  yield 'comm_layout', ['comm', '--variant', 'multi_head', '--mesh_shape',
                        'model:2', '--strategy', 'heads_parallel', '--layout',
                        'heads:model', '--format', 'md'] + dims


def run(argv):
  """Returns the bytes a command printed: exit code, stdout, stderr."""
  mtf_th = os.path.join(os.path.dirname(sys.executable), 'mtf_th')
  done = subprocess.run([mtf_th] + argv, capture_output=True, check=False)
  return (b'exit %d\n--- stdout\n' % done.returncode + done.stdout +
          b'--- stderr\n' + done.stderr)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  action = parser.add_mutually_exclusive_group(required=True)
  action.add_argument('--save', metavar='DIR')
  action.add_argument('--check', metavar='DIR')
  parser.add_argument('--skip_comm', action='store_true')
  args = parser.parse_args(argv)
  commands = (list(costs_commands()) + list(perf_commands()) +
              list(plan_commands()))
  if not args.skip_comm:
    commands += list(comm_commands())
  directory = args.save or args.check
  os.makedirs(directory, exist_ok=True)
  differ = []
  for name, argv in commands:
    output = run(argv)
    path = os.path.join(directory, name + '.txt')
    if args.save:
      with open(path, 'wb') as f:
        f.write(output)
      print('%s %s' % (hashlib.sha1(output).hexdigest()[:10], name))
      continue
    with open(path, 'rb') as f:
      same = f.read() == output
    print('%s %s' % ('same' if same else 'DIFFERS', name))
    if not same:
      differ.append(name)
      with open(path + '.new', 'wb') as f:
        f.write(output)
  if differ:
    print('%d of %d outputs differ (new output in DIR/NAME.txt.new): %s' %
          (len(differ), len(commands), ' '.join(differ)))
    sys.exit(1)
  print('%d outputs %s' % (len(commands),
                           'saved' if args.save else 'byte-identical'))


if __name__ == '__main__':
  main()
