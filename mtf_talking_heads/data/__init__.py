"""Data with no download: an embedded corpus, a local vocabulary, seqio tasks.

Importing this package registers (without reading or downloading anything):
  th_span_corruption, th_mlm, th_prefix_lm      over the embedded corpus
                                                 (or gin th_data.corpus_paths)
  th_finetune_squad_glue_superglue               SQuAD + GLUE + SuperGLUE mixture
and t5's own tasks and mixtures (c4_v220_span_corruption,
glue_v002_proportional, super_glue_v102_proportional, squad_v010_allanswers).

  corpus.default_corpus_paths()  {"train": path, "validation": path}
  corpus.stats()                 sizes and sources of the embedded corpus
  vocab.default_vocab_path()     the locally trained SentencePiece model
  tasks.register_text_tasks(name, train_path, validation_path, vocab_path=None)

See docs/data.md.
"""
# first: mends t5/mtf imports
from mtf_talking_heads.core import compat  # noqa: F401  pylint: disable=unused-import
from mtf_talking_heads.data import corpus  # pylint: disable=g-bad-import-order
from mtf_talking_heads.data import tasks  # registers th_span_corruption, ...
from mtf_talking_heads.data import vocab
# after tasks (they use its sources and preprocessors; tasks does not import
# them, so there is no cycle): th_mlm_sop, th_sop; the embedded fine-tuning
# tasks and th_finetune_embedded
from mtf_talking_heads.data import downstream  # noqa: F401  registers  pylint: disable=unused-import
from mtf_talking_heads.data import sop  # noqa: F401  registers  pylint: disable=unused-import

from mtf_talking_heads.data.corpus import corpus_paths
from mtf_talking_heads.data.corpus import default_corpus_paths
from mtf_talking_heads.data.corpus import stats
from mtf_talking_heads.data.tasks import register_text_tasks
from mtf_talking_heads.data.vocab import default_vocab_path
from mtf_talking_heads.data.vocab import get_vocabulary

# The package's API (docs/data.md); the modules above register tasks.
__all__ = ["corpus", "vocab", "tasks", "sop", "downstream", "corpus_paths",
           "default_corpus_paths", "stats", "register_text_tasks",
           "default_vocab_path", "get_vocabulary"]
