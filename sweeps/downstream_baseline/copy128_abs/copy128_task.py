"""Scratch (not committed): th_copy128_bytes, th_copy_bytes at 128 bytes."""
import functools
import seqio
from t5.evaluation import metrics as t5_metrics
from mtf_talking_heads.data import downstream

downstream._MAKERS["th_copy128"] = functools.partial(downstream.copy_examples,
                                                     length=128)
downstream._add("th_copy128_bytes", "th_copy128", seqio.ByteVocabulary(),
                [t5_metrics.sequence_accuracy], None)
