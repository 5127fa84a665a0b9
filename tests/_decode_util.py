"""Incremental decoding vs teacher forcing, on one small graph per model.

`DecodeRun` builds a decoder-only model (a `transformer.Unitransformer`) or,
given encoder layers, an encoder-decoder (`transformer.Bitransformer`) with
random weights and a tiny vocabulary, and evaluates in one session:

  * ``decoded``: greedy decoding (temperature 0.0, to the full length) with
    mtf's own `Unitransformer.sample_autoregressive` / `Bitransformer.decode`,
    i.e. the "first_part" + "incremental" modes inside mtf's while loop;
  * ``forced_on_decoded``: the teacher-forced logits (mode "eval", all
    positions in parallel) of that decoded sequence; each decoded token must
    be their argmax at its position;
  * ``stepped``: per-position logits of a fixed random target sequence from an
    unrolled loop that calls the model in "incremental" mode one position at
    a time, with the Context set up as `sample_autoregressive` sets it up:
    positions < `prefix` start from empty caches (as greedy decoding does);
    at position `prefix` the caches are replaced by the states that
    "first_part" recorded for the first `prefix` target tokens (as decoding
    a partial sequence does) and the steps continue from there;
  * ``first_part``: the logits of that "first_part" call (valid for
    positions < prefix);
  * ``forced``: the teacher-forced logits of the target sequence.

Everything runs on one logical CPU (mesh ""), in float32.
"""
import mtf_talking_heads  # noqa: F401  (first: mends mtf's imports)
import gin
import mesh_tensorflow as mtf
from mesh_tensorflow.transformer import transformer
import numpy as np
import tensorflow.compat.v1 as tf

from mtf_talking_heads.measure import harness
import _strategy_util as su

_EVAL = "eval"
# Bitransformer.decode passes no stop token: mtf's gin default (1) would end
# the loop once every row has produced a 1.  Within this gin scope decoding
# runs to the full length, as sample_autoregressive(stop_at_token=None).
_SCOPE = "mtf_th_decode_test"


def _bind_full_length_decoding():
  """Binds stop_at_token=None for sample_autoregressive within _SCOPE only."""
  with gin.unlock_config():
    gin.bind_parameter(
        _SCOPE + "/Unitransformer.sample_autoregressive.stop_at_token", None)


class DecodeRun(object):
  """One model, its greedy decode, teacher-forced and stepped logits.

  Example:
    run = DecodeRun([layers.TalkingHeadsAttention(heads_k=4, heads=4,
                                                  heads_v=4, d_k=4, d_v=4)])
    out = run.results   # {"decoded": [batch, length], "forced": ..., ...}
  """

  def __init__(self, decoder_layers, encoder_layers=None, d_model=16,
               vocab=24, batch=2, length=5, input_length=4, prefix=3,
               seed=20200305):
    """Builds the graph and runs it once (results in `self.results`).

    Args:
      decoder_layers: list of transformer layers of the decoder stack.
      encoder_layers: optional list of layers of an encoder stack; if given
        the model is a Bitransformer.
      d_model: an integer.
      vocab: an integer, vocabulary size (no padding to a multiple).
      batch: an integer.
      length: an integer, the decoded length.
      input_length: an integer, the encoder input length.
      prefix: an integer in [1, length): steps before it start from empty
        caches, steps from it on continue from "first_part" states.
      seed: an integer.
    """
    harness.parse_mtf_defaults()
    _bind_full_length_decoding()
    rng = np.random.RandomState(seed)
    self.length = length
    self.prefix = prefix
    self.vocab = vocab
    self.targets = rng.randint(2, vocab, size=(batch, length)).astype(np.int32)
    # encoder inputs; the last row is padded to exercise the encoder mask
    enc = rng.randint(2, vocab, size=(batch, input_length)).astype(np.int32)
    enc[-1, input_length - 2:] = 0
    self.encoder_inputs = enc
    for i, layer in enumerate(decoder_layers):
      layer.set_name("layer_%03d" % i)
    for i, layer in enumerate(encoder_layers or []):
      layer.set_name("layer_%03d" % i)

    self.graph = tf.Graph()
    with self.graph.as_default():
      tf.set_random_seed(seed)
      mesh = mtf.Mesh(mtf.Graph(), "mesh")
      self.mesh = mesh
      self.batch_dim = mtf.Dimension("batch", batch)
      self.length_dim = mtf.Dimension("length", length)
      self.variable_dtype = mtf.VariableDType(tf.float32, tf.float32,
                                              tf.float32)
      decoder = transformer.Unitransformer(
          layer_stack=transformer.LayerStack(decoder_layers),
          d_model=d_model, input_vocab_size=vocab, output_vocab_size=vocab,
          autoregressive=True, max_length=max(length, input_length),
          shared_embedding_and_softmax_weights=False,
          name="decoder",
          vocab_divisor=1)
      self.decoder = decoder
      targets = self._import(self.targets, [self.batch_dim, self.length_dim])
      outputs = {}
      if encoder_layers is None:
        self.model = decoder
        self._encoder_kwargs = lambda: {}
        partial = mtf.zeros(mesh, targets.shape, dtype=tf.int32)
        decoded = decoder.sample_autoregressive(
            partial, stop_at_token=None, temperature=0.0,
            variable_dtype=self.variable_dtype, has_partial_sequences=False)
      else:
        encoder = transformer.Unitransformer(
            layer_stack=transformer.LayerStack(encoder_layers),
            d_model=d_model, input_vocab_size=vocab, output_vocab_size=None,
            autoregressive=False, max_length=max(length, input_length),
            name="encoder", vocab_divisor=1)
        self.model = transformer.Bitransformer(encoder, decoder)
        inputs = self._import(
            enc, [self.batch_dim, mtf.Dimension("length", input_length)])
        encoded = self._encode(inputs)
        self._encoder_kwargs = lambda: encoded
        # Bitransformer.decode's output length is the input length unless
        # max_decode_length is given; within _SCOPE it has no stop token.
        with gin.config_scope(_SCOPE):
          decoded = self.model.decode(
              inputs, variable_dtype=self.variable_dtype, temperature=0.0,
              max_decode_length=length)
      outputs["decoded"] = decoded
      outputs["forced_on_decoded"] = self._forced(decoded)
      outputs["forced"] = self._forced(targets)
      outputs["first_part"], outputs["stepped"] = self._stepped(targets,
                                                                prefix)

      lowering = mtf.Lowering(mesh.graph, {mesh: harness.mesh_impl("", "")})
      tf_outputs = {k: lowering.export_to_tf_tensor(v)
                    for k, v in outputs.items()}
      with tf.Session(graph=self.graph,
                      config=su.session_config()) as session:
        session.run(tf.global_variables_initializer())
        session.run(lowering.copy_masters_to_slices())
        self.results = session.run(tf_outputs)

  # ----------------------------------------------------------------- pieces
  def _import(self, array, dims):
    return mtf.import_tf_tensor(self.mesh, tf.constant(array), dims)

  def _encode(self, inputs):
    """Encoder pass and decoder kwargs, exactly as Bitransformer.decode."""
    encoder_layer_outputs = []
    shared_params = self.model._shared_params(  # pylint: disable=protected-access
        inputs.mesh, self.variable_dtype)
    encoder_sequence_id = mtf.minimum(inputs, 1)
    encoder_output, _ = self.model.encoder.call_simple(
        inputs=inputs, targets=None, compute_loss=False, mode=_EVAL,
        variable_dtype=self.variable_dtype, sequence_id=encoder_sequence_id,
        shared_params=shared_params, layer_outputs=encoder_layer_outputs)
    rename = mtf.layers.rename_length_to_memory_length
    return dict(encoder_output=rename(encoder_output),
                encoder_sequence_id=rename(encoder_sequence_id),
                encoder_inputs=rename(inputs),
                shared_params=shared_params,
                encoder_layer_outputs=encoder_layer_outputs)

  def _forced(self, ids):
    """Teacher-forced logits [batch, length, vocab] of the sequence `ids`."""
    if self.model is self.decoder:
      logits, _ = self.decoder.call_simple(
          inputs=transformer.autoregressive_inputs(ids), targets=ids,
          compute_loss=False, mode=_EVAL, variable_dtype=self.variable_dtype)
      return logits
    kwargs = self._encoder_kwargs()
    # sequence_id of ones: no decoder position is padding (decoding uses
    # sequence_id=1 too), even where a decoded token is 0.
    ones = mtf.ones(self.mesh, ids.shape, dtype=tf.int32)
    logits, _ = self.decoder.call_simple(
        inputs=transformer.autoregressive_inputs(ids), targets=ids,
        compute_loss=False, mode=_EVAL, variable_dtype=self.variable_dtype,
        sequence_id=ones, **kwargs)
    return logits

  def _context(self, mode, position, inputs, states, new_states,
               constant_states, kwargs, length_range):
    """A Context set up as Unitransformer.sample_autoregressive sets it up."""
    return transformer.Context(
        model=self.decoder, mesh=self.mesh, batch_dims=[self.batch_dim],
        length_dim=self.length_dim, variable_dtype=self.variable_dtype,
        mode=mode, position=position,
        position_is_default=(mode == "first_part"),
        states=states, new_states=new_states,
        initial_position=None,
        sequence_id=(1 if kwargs.get("encoder_sequence_id") is not None
                     else None),
        constant_states=constant_states,
        write_priority=length_range,
        read_priority=length_range if mode == "first_part" else position,
        inputs=inputs, **kwargs)

  def _stepped(self, ids, prefix):
    """Logits of `ids` from one "incremental" step per position.

    Args:
      ids: int32 [batch, length] target sequence.
      prefix: steps at positions < prefix start from empty caches (zeros, as
        sample_autoregressive(has_partial_sequences=False)); at position
        `prefix` the caches become the states "first_part" recorded for
        ids[:prefix] (as sample_autoregressive with partial sequences).
    Returns:
      (first_part logits, stepped logits), each [batch, length, vocab].
    """
    kwargs = self._encoder_kwargs()
    length_dim = self.length_dim
    length_range = mtf.range(self.mesh, length_dim, tf.int32)
    partial = ids * mtf.to_int32(mtf.less(length_range, prefix))
    first = self._context("first_part", length_range, partial, None, [], [],
                          kwargs, length_range)
    with tf.variable_scope(self.decoder.name, reuse=tf.AUTO_REUSE):
      first_logits = self.decoder._call_internal(  # pylint: disable=protected-access
          first, transformer.autoregressive_inputs(partial))
    states = [mtf.zeros_like(t) for t in first.new_states]
    per_position = []
    for p in range(length_dim.size):
      if p == prefix:
        states = first.new_states
      position = mtf.constant(self.mesh, p, mtf.Shape([self.batch_dim]),
                              dtype=tf.int32)
      if p == 0:
        inputs = mtf.zeros(self.mesh, [self.batch_dim], dtype=tf.int32)
      else:
        inputs = mtf.gather(ids, p - 1, length_dim)
      step = self._context("incremental", position, inputs, states, [],
                           first.constant_states, kwargs, length_range)
      with tf.variable_scope(self.decoder.name, reuse=tf.AUTO_REUSE):
        logits = self.decoder._call_internal(step, inputs)  # pylint: disable=protected-access
      states = step.new_states
      per_position.append(logits)
    return first_logits, mtf.stack(per_position, length_dim.name, axis=1)
