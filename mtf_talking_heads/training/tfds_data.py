"""TFDS data of t5's downstream tasks: where it is read from, whether it is there.

Owns use_data_dir() (points seqio's TFDS sources at --data_dir, e.g. a
bucket where the user prepared GLUE / SuperGLUE / SQuAD with
``tfds build``) and check_data(): every TFDS dataset a mixture reads must be
prepared there, checked by listing ``<data_dir>/<name>/<config>/<version>/
dataset_info.json`` (no download, no graph), so a missing dataset stops a
command with one line before anything is built.
"""
import os

from mtf_talking_heads.training import errors


def default_data_dir():
  """TFDS's own default: $TFDS_DATA_DIR, else ~/tensorflow_datasets."""
  return os.environ.get("TFDS_DATA_DIR") or os.path.join(
      os.path.expanduser("~"), "tensorflow_datasets")


def get_provider(name, name_flag="MIXTURE_NAME"):
  """The registered seqio task or mixture `name`.

  Raises:
    ConfigError: naming `name_flag` (e.g. --task), with close names.
  """
  import difflib  # pylint: disable=g-import-not-at-top
  import seqio  # pylint: disable=g-import-not-at-top
  try:
    return seqio.get_mixture_or_task(name)
  except ValueError:
    known = sorted(seqio.MixtureRegistry.names()) + sorted(
        seqio.TaskRegistry.names())
    close = difflib.get_close_matches(name, known, n=3)
    ours = sorted(k for k in known if k.startswith("th_"))
    raise errors.ConfigError(
        "%s %r is not a registered task or mixture; %s" % (
            name_flag, name, ("did you mean %s?" % " or ".join(close))
            if close else "this package registers %s" % ", ".join(ours))
    ) from None


def tfds_datasets(mixture_or_task_name, name_flag="MIXTURE_NAME"):
  """Sorted TFDS names ("glue/mnli:1.0.0") the mixture's tasks read."""
  import seqio  # pylint: disable=g-import-not-at-top
  provider = get_provider(mixture_or_task_name, name_flag)
  tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
  names = set()
  for task in tasks:
    dataset = getattr(task.source, "tfds_dataset", None)
    if dataset is not None:
      names.add(dataset.name)
  return sorted(names)


def dataset_dir(data_dir, name):
  """<data_dir>/glue/mnli/1.0.0 for "glue/mnli:1.0.0"."""
  path, version = name.split(":")
  return os.path.join(data_dir, *path.split("/"), version)


def missing_datasets(mixture_or_task_name, data_dir, name_flag="MIXTURE_NAME"):
  """The TFDS names of the mixture that data_dir lacks."""
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  return [n for n in tfds_datasets(mixture_or_task_name, name_flag)
          if not tf.io.gfile.exists(os.path.join(dataset_dir(data_dir, n),
                                                 "dataset_info.json"))]


def check_data(mixture_or_task_name, data_dir=None, flag="--data_dir",
               name_flag="MIXTURE_NAME"):
  """Raises ConfigError (one line) unless every TFDS dataset is prepared.

  Args:
    mixture_or_task_name: a registered task or mixture.
    data_dir: the TFDS data directory (None: TFDS's default).
    flag: the option named in the message.
    name_flag: what named the mixture (MIXTURE_NAME, --task).
  """
  import tensorflow.compat.v1 as tf  # pylint: disable=g-import-not-at-top
  where = data_dir or default_data_dir()
  try:
    missing = missing_datasets(mixture_or_task_name, where, name_flag)
  except tf.errors.OpError as e:  # e.g. a bucket that cannot be reached
    raise errors.ConfigError("cannot read %s=%s: %s" % (
        flag, where, str(e.message).splitlines()[0])) from None
  if missing:
    raise errors.ConfigError(
        "%s reads %d TFDS datasets that %s=%s lacks (%s%s): prepare them "
        "there with `tfds build` (e.g. `tfds build glue/mnli --data_dir "
        "%s`) or give the directory that has them" % (
            mixture_or_task_name, len(missing), flag, where,
            ", ".join(missing[:3]), ", ..." if len(missing) > 3 else "",
            where))


def use_data_dir(data_dir):
  """Reads TFDS datasets from data_dir from now on (None: no change)."""
  if data_dir:
    import seqio  # pylint: disable=g-import-not-at-top
    seqio.set_tfds_data_dir_override(data_dir)
