"""Values checked for meaning, and refusals before TensorFlow (issue 35).

Through the real `mtf_th` command line: a learning rate <= 0 (or not
finite), a corpus of blank lines, a step listed twice, mesh_shape = 42,
seed = 'x', finetune into its own --pretrained_model_dir, decode (or
eval --metrics) of a decoder-only LM, a grpc:// --cluster entry (train
and `mtf_th server` alike: runtime/cluster.parse_addresses), and `mtf_th
server`'s missing --module_import and port in use.  Each:
exit status 2, one line on stderr with its key words, no TensorFlow
imported (the child process says so) and nothing written.  Two need
TensorFlow and are one line too (slow, each its own `mtf_th train`): a
layer that rejects its gin argument (gin adds "In call to configurable"
lines to the message), and training data that yields no example although
its files hold bytes (TFRecords of blank texts: the run used to exit 0
after 1 of 4 steps).
"""
import socket
import struct

import pytest

import _cli_util

LM = ["--gin_file", "experiments/lm_heads/01_multi_head_4_32.gin",
      "--gin_file", "models/lm_tiny.gin"]
TH = ["--gin_file", "experiments/t5_heads/07_talking_heads_24_32.gin",
      "--gin_file", "models/t5_tiny.gin"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """A folder with a corpus of blank lines and an (empty) run folder."""
  base = tmp_path_factory.mktemp("values")
  for split in ("train", "validation"):
    (base / ("blank_%s.txt" % split)).write_text("\n\n   \n\t\n\n")
  (base / "run").mkdir()
  (base / "lm_run").mkdir()  # what eval and decode read first: its config
  (base / "lm_run" / "operative_config.gin").write_text(
      "run.model_type = 'lm'\nMIXTURE_NAME = 'th_lm_bytes'\n")
  return str(base)


def _corpus(prefix):
  return ["--gin_param", "th_data.corpus_paths.train = '{base}/%s_train.txt'"
          % prefix, "--gin_param",
          "th_data.corpus_paths.validation = '{base}/%s_validation.txt'"
          % prefix]


def _train(files, *params):
  """`mtf_th train` into a new model_dir, each of `params` a --gin_param."""
  return (["train", "--model_dir", "{base}/new"] + files +
          [a for p in params for a in ("--gin_param", p)])


# name -> (argv with {base}, words of the one line)
CASES = {
    "negative_learning_rate": (
        _train(LM, "learning_rate = -0.01"),
        ["learning_rate = -0.01", "a learning rate must be a finite number "
         "> 0"]),
    "zero_learning_rate": (
        _train(LM, "learning_rate = 0"), ["learning_rate = 0"]),
    "infinite_learning_rate": (
        _train(LM, "learning_rate = 1e999"), ["learning_rate = inf"]),
    "negative_rate_binding": (
        _train(LM, "constant_learning_rate.learning_rate = -1.0"),
        ["constant_learning_rate.learning_rate = -1.0"]),
    "negative_constant_schedule": (
        _train(TH, "utils.run.learning_rate_schedule = -0.1"),
        ["utils.run.learning_rate_schedule = -0.1", "finite number > 0"]),
    "negative_noam_multiplier": (
        _train(TH, "learning_rate_schedule_noam.multiplier = -2.0"),
        ["learning_rate_schedule_noam.multiplier = -2.0"]),
    "finetune_negative_learning_rate": (
        ["finetune", "--model_dir", "{base}/new", "--pretrained_model_dir",
         "{base}/run", "--gin_file",
         "experiments/lm_heads/01_multi_head_4_32.gin", "--gin_file",
         "experiments/finetune_embedded_lm.gin", "--gin_param",
         "learning_rate = -1e-3"], ["learning_rate = -0.001"]),
    "blank_corpus": (
        _train(LM) + _corpus("blank"),
        ["th_data.corpus_paths.train=", "blank_train.txt",
         "hold only blank lines", "yields no example"]),
    "blank_corpus_eval": (
        ["eval", "--model_dir", "{base}/run"] + LM + _corpus("blank"),
        ["th_data.corpus_paths.train=", "hold only blank lines"]),
    "mesh_shape_a_number": (
        _train(TH, "mesh_shape = 42"), ["mesh_shape = 42 is not a string"]),
    "mesh_shape_a_number_eval": (
        ["eval", "--model_dir", "{base}/run"] + TH +
        ["--gin_param", "mesh_shape = 42"], ["mesh_shape = 42"]),
    "layout_a_list": (
        _train(TH, "layout = [1, 2]"), ["layout = [1, 2] is not a string"]),
    "seed_a_string": (
        _train(TH, "seed = 'x'"), ["seed = 'x' is not an integer"]),
    "seed_a_float_decode": (
        ["decode", "--model_dir", "{base}/run", "--input", "a b"] + TH +
        ["--gin_param", "seed = 1.5"], ["seed = 1.5 is not an integer"]),
    "negative_dropout": (
        _train(TH, "dropout_rate = -0.1"), ["dropout_rate = -0.1"]),
    "zero_length": (
        _train(TH, "inputs_length = 0"),
        ["inputs_length must be a positive integer, got 0"]),
    "parameter_gin_would_refuse": (
        _train(TH, "mtf_th.TalkingHeadsAttention.d_q = 2"),
        ["mtf_th.TalkingHeadsAttention has no parameter 'd_q'"]),
    "keep_checkpoint_steps_twice": (
        ["train", "--model_dir", "{base}/new", "--keep_checkpoint_steps",
         "10,10"] + LM, ["--keep_checkpoint_steps", "'10,10' lists step 10 "
                         "more than once", "give each step once"]),
    "keep_checkpoint_steps_negative": (
        ["train", "--model_dir", "{base}/new", "--keep_checkpoint_steps",
         "5,-1"] + LM, ["--keep_checkpoint_steps", "steps >= 0"]),
    "eval_checkpoint_steps_twice": (
        ["eval", "--model_dir", "{base}/run", "--checkpoint_steps", "10,10"],
        ["--checkpoint_steps", "step 10 more than once"]),
    "sweep_eval_steps_twice": (
        ["sweep", "--paper_table", "lm_heads", "--rows", "1", "--output_dir",
         "{base}/sweep", "--eval_steps", "10,20,20", "--dry_run"],
        ["--eval_steps", "'10,20,20' lists step 20 more than once"]),
    "finetune_into_its_pretrained_model_dir": (
        ["finetune", "--model_dir", "{base}/run", "--pretrained_model_dir",
         "{base}/run/"] + LM,
        ["--model_dir must differ from --pretrained_model_dir"]),
    "decode_a_decoder_only_lm": (
        ["decode", "--model_dir", "{base}/lm_run", "--input", "a b"],
        ["decode needs a text-to-text model", "this one is 'lm': score it "
         "with mtf_th eval"]),
    "eval_metrics_of_a_decoder_only_lm": (
        ["eval", "--model_dir", "{base}/lm_run", "--metrics"],
        ["downstream metrics decode text: scoring needs a text-to-text "
         "model", "this one is 'lm'"]),
    "server_grpc_url": (
        ["server", "--cluster", "grpc://localhost:2222", "--task", "0"],
        ["--cluster entry 0 ('grpc://localhost:2222') is not HOST:PORT",
         "localhost:2222"]),
    "train_cluster_grpc_url": (  # the servers' refusal (one parser)
        ["train", "--model_dir", "{base}/new", "--cluster",
         "grpc://localhost:2222"] + LM,
        ["--cluster entry 0 ('grpc://localhost:2222') is not HOST:PORT: "
         "give the address without a scheme, e.g. localhost:2222"]),
    "server_module_import_missing": (
        ["server", "--cluster", "localhost:2222", "--task", "0",
         "--module_import", "no_such_module_xyz"],
        ["--module_import 'no_such_module_xyz': no such module"]),
    "server_module_import_missing_submodule": (
        ["server", "--cluster", "localhost:2222", "--task", "0",
         "--module_import", "mtf_talking_heads.no_such_tasks"],
        ["--module_import 'mtf_talking_heads.no_such_tasks'"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_in_one_line_before_tensorflow(base, name):
  argv, words = CASES[name]
  argv = [a.format(base=base) for a in argv]
  before = _cli_util.snapshot(base)
  result = _cli_util.run(argv, cwd=base)
  lines = result.stderr.splitlines()
  assert result.code == 2, result.stderr
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("mtf_th %s: error: " % argv[0]), lines[0]
  for word in words:
    assert word in lines[0], lines[0]
  assert result.tensorflow is False
  assert _cli_util.snapshot(base) == before


def test_text_to_text_is_the_decoders():
  """prechecks.TEXT_TO_TEXT (before TensorFlow) is training/decoding's,
  read from its source (importing it would load TensorFlow)."""
  import ast  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from mtf_talking_heads.commands import prechecks  # pylint: disable=g-import-not-at-top
  with open(os.path.join(_cli_util.REPO, "mtf_talking_heads", "training",
                         "decoding.py")) as f:
    tree = ast.parse(f.read())
  found = [ast.literal_eval(n.value) for n in tree.body
           if isinstance(n, ast.Assign) and
           [t.id for t in n.targets] == ["TEXT_TO_TEXT"]]
  assert found == [prechecks.TEXT_TO_TEXT]


def test_server_port_in_use_says_address_in_use(base):
  with socket.socket() as taken:
    taken.bind(("", 0))
    taken.listen()
    port = taken.getsockname()[1]
    result = _cli_util.run(["server", "--cluster", "localhost:%d" % port,
                            "--task", "0"], cwd=base)
  assert result.code == 2, result.stderr
  assert result.stderr.splitlines() == [
      "mtf_th server: error: cannot listen on localhost:%d (task 0): address "
      "in use (another process listens on port %d: stop it, or give this "
      "task another port in --cluster, the same list for every server and "
      "the client)" % (port, port)]
  assert result.tensorflow is False


def test_server_finds_modules_without_importing_them():
  from mtf_talking_heads.commands import server  # pylint: disable=g-import-not-at-top
  for name in ("json", "os.path", "xml.etree.ElementTree",
               "mtf_talking_heads.data.tasks",
               "mtf_talking_heads.layers"):  # MOVED_MODULES' old path
    assert server.findable(name), name
  for name in ("no_such_module_xyz", "json.nope", "mtf_talking_heads.nope"):
    assert not server.findable(name), name


def _tfrecord_of_blank_texts(path):
  """A TFRecord file of one tf.train.Example whose "text" is blank, written
  without TensorFlow (the bytes TensorFlow's TFRecordWriter writes)."""
  def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
      crc ^= byte
      for _ in range(8):
        crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

  def masked(data):
    crc = crc32c(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8)
                       & 0xFFFFFFFF)

  def field(number, payload):  # a length-delimited protobuf field
    return bytes([number << 3 | 2, len(payload)]) + payload

  example = field(1, field(1, field(1, b"text") + field(
      2, field(1, field(1, b"   ")))))  # Example{features{"text": bytes}}
  length = struct.pack("<Q", len(example))
  with open(path, "wb") as f:
    f.write(length + masked(length) + example + masked(example))


def _after_tf(argv):
  """Runs `mtf_th ARGV` (TensorFlow loads); its status and the lines of
  stderr that are not progress ("[train] ...")."""
  result = _cli_util.run(argv)
  return result.code, [l for l in result.stderr.splitlines()
                       if not l.startswith("[")]


@pytest.mark.slow
def test_a_layer_that_rejects_its_argument_is_one_line(tmp_path):
  code, lines = _after_tf(
      ["train", "--model_dir", str(tmp_path / "run")] + TH +
      ["--gin_param", "mtf_th.TalkingHeadsAttention.dynamic = ['x2q']"])
  assert code == 2 and len(lines) == 1, lines
  assert lines[0].startswith(
      "mtf_th train: error: the model's layers reject their gin arguments: ")
  assert "x2q" in lines[0]
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_training_data_that_yields_no_example_is_one_line(tmp_path):
  """Its files hold bytes (the blank-lines check before TensorFlow cannot
  tell), the task yields nothing: the run used to exit 0 after 1 step."""
  for split in ("train", "validation"):
    _tfrecord_of_blank_texts(str(tmp_path / ("%s.tfrecord" % split)))
  code, lines = _after_tf(
      ["train", "--model_dir", str(tmp_path / "run")] + LM +
      ["--gin_param", "d_model = 32", "--gin_param", "d_ff = 64"] + sum(
          (["--gin_param", "th_data.corpus_paths.%s = '%s/%s.tfrecord'"
            % (split, tmp_path, split)] for split in ("train", "validation")),
          []))
  assert code == 1 and len(lines) == 1, lines
  step = lines[0].split("ended at step ")[-1].split(" ")[0]
  assert lines[0] == (
      "mtf_th train: error: the training data ended at step %s of 4: task "
      "'th_lm_bytes' yields no example from its train split (check its "
      "data, e.g. th_data.corpus_paths); fix it and train into a new "
      "--model_dir" % step)
  assert int(step) < 4
