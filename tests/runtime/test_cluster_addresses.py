"""--cluster is parsed by one function for the client and the servers.

runtime/cluster.parse_addresses refuses an entry with a scheme or a path
(grpc://host:port: the servers' ClusterSpec aborts the process on it, status
134), so `mtf_th train --cluster grpc://...` and `mtf_th server --cluster
grpc://...` are refused with the same line, status 2, before anything is
probed, built or loaded.  Pure Python: the commands' main() in-process
(tests/commands/test_bad_inputs_values.py runs the same refusals as
subprocesses and checks TensorFlow was not imported).
"""
import pytest

from mtf_talking_heads.commands import server
from mtf_talking_heads.commands import train
from mtf_talking_heads.runtime import cluster

GRPC_LINE = ("--cluster entry 0 ('grpc://localhost:2222') is not HOST:PORT: "
             "give the address without a scheme, e.g. localhost:2222")


@pytest.mark.parametrize("text,line", [
    ("grpc://localhost:2222", GRPC_LINE),
    ("h0:2222, grpc://h1:2222/",
     "--cluster entry 1 ('grpc://h1:2222/') is not HOST:PORT: give the "
     "address without a scheme, e.g. h1:2222"),
    ("h0:2222/path",
     "--cluster entry 0 ('h0:2222/path') is not HOST:PORT: give the address "
     "without a scheme, e.g. h0:2222"),
])
def test_url_entries_refused(text, line):
  with pytest.raises(cluster.ClusterError) as e:
    cluster.parse_addresses(text)
  assert str(e.value) == line


def test_plain_entries_accepted():
  assert cluster.parse_addresses(" h0:2222,[::1]:2223 ") == ["h0:2222",
                                                             "[::1]:2223"]


def test_client_and_server_refuse_a_url_alike(tmp_path, capsys):
  """The same line from train (the client) and server, status 2; nothing
  written into model_dir."""
  model_dir = tmp_path / "run"
  assert train.main(["--model_dir", str(model_dir), "--cluster",
                     "grpc://localhost:2222"]) == 2
  client = capsys.readouterr().err.splitlines()
  assert server.main(["--cluster", "grpc://localhost:2222", "--task",
                      "0"]) == 2
  servers = capsys.readouterr().err.splitlines()
  assert client == ["mtf_th train: error: " + GRPC_LINE]
  assert servers == ["mtf_th server: error: " + GRPC_LINE]
  assert not model_dir.exists()
  assert cluster.active() is None
