"""The seqio task and mixture names a `mtf_th` command can use, without TensorFlow.

Importing mtf_talking_heads.data registers these (tasks.py, sop.py,
downstream.py and t5.data.mixtures, which tasks.py imports), but that import
needs TensorFlow (10-30 s).  commands/prechecks.task reads this file by path
(it imports nothing, so the package's __init__ does not run) to refuse a
misspelt `mtf_th eval --metrics --task NAME` in well under a second.
tests/commands/test_bad_inputs.py compares both tuples with seqio's registries after
the real import: a task registered in data/ must be added to THIS_PACKAGE
(and a t5 upgrade may change T5).  vocabulary_size() says how many ids each
name's vocabulary has, for `mtf_th plan` (tests/data/test_task_vocab.py
compares it with the registered tasks' vocabularies).
"""

# Registered by this package's data modules.
THIS_PACKAGE = (
    "th_copy128_bytes",
    "th_copy_bytes",
    "th_embedded_acceptability",
    "th_embedded_acceptability_bytes",
    "th_embedded_acceptability_lm",
    "th_embedded_acceptability_lm_bytes",
    "th_embedded_cloze",
    "th_embedded_cloze_bytes",
    "th_embedded_continuation",
    "th_embedded_continuation_bytes",
    "th_embedded_entailment",
    "th_embedded_entailment_bytes",
    "th_embedded_misspelling",
    "th_embedded_misspelling_bytes",
    "th_embedded_misspelling_lm",
    "th_embedded_misspelling_lm_bytes",
    "th_embedded_next_word",
    "th_embedded_next_word_bytes",
    "th_embedded_nli",
    "th_embedded_nli_bytes",
    "th_finetune_embedded",
    "th_finetune_embedded_bytes",
    "th_finetune_lexical",
    "th_finetune_lexical_bytes",
    "th_finetune_lm",
    "th_finetune_lm_bytes",
    "th_finetune_squad_glue_superglue",
    "th_lm_bytes",
    "th_mlm",
    "th_mlm_sop",
    "th_prefix_lm",
    "th_prefix_lm_bytes",
    "th_sop",
    "th_span_corruption",
    "th_span_corruption_bytes",
)

# Registered by t5==0.9.4's t5.data.mixtures (tasks and mixtures).
T5 = (
    "all_equal",
    "all_mix",
    "all_proportional",
    "c4_noclean_v020_unsupervised",
    "c4_prefix_lm_objective_decoder_architecture",
    "c4_prefix_lm_objective_encoder_decoder_architecture",
    "c4_realnewslike_v020_unsupervised",
    "c4_v020_unsupervised",
    "c4_v220_full_lm",
    "c4_v220_iid_denoising",
    "c4_v220_prefix_lm",
    "c4_v220_span_corruption",
    "c4_webtextlike_v020_unsupervised",
    "cnn_dailymail_v002",
    "dpr_v001_simple",
    "dpr_v001_simple_1_sentinel",
    "en_mix",
    "glue_ax_v002",
    "glue_cola_v002",
    "glue_mnli_and_dev_v002",
    "glue_mnli_matched_v002",
    "glue_mnli_mismatched_v002",
    "glue_mnli_v002",
    "glue_mrpc_v002",
    "glue_qnli_v002",
    "glue_qqp_v002",
    "glue_rte_v002",
    "glue_sst2_v002",
    "glue_stsb_v002",
    "glue_v002_proportional",
    "glue_wnli_v002",
    "glue_wnli_v002_simple_eval",
    "large_supervised_equal",
    "large_supervised_proportional",
    "large_translation_equal",
    "leave_one_out_cnn_dailymail_v002",
    "leave_one_out_glue_v002_proportional",
    "leave_one_out_squad_v010_allanswers",
    "leave_one_out_super_glue_v102_proportional",
    "leave_one_out_wmt15_enfr_v003",
    "leave_one_out_wmt16_enro_v003",
    "leave_one_out_wmt_t2t_ende_v003",
    "squad_trivia_qa_equal",
    "squad_v010",
    "squad_v010_allanswers",
    "squad_v010_allanswers_span",
    "squad_v010_context_free",
    "super_glue_axb_v102",
    "super_glue_axb_v102_1_sentinel",
    "super_glue_axg_v102",
    "super_glue_axg_v102_1_sentinel",
    "super_glue_boolq_v102",
    "super_glue_boolq_v102_1_sentinel",
    "super_glue_cb_v102",
    "super_glue_cb_v102_1_sentinel",
    "super_glue_copa_v102",
    "super_glue_copa_v102_1_sentinel",
    "super_glue_multirc_v102",
    "super_glue_multirc_v102_1_sentinel",
    "super_glue_record_v102",
    "super_glue_record_v102_1_sentinel",
    "super_glue_rte_v102",
    "super_glue_rte_v102_1_sentinel",
    "super_glue_v102_proportional",
    "super_glue_v102_proportional_sentinel",
    "super_glue_wic_v102",
    "super_glue_wic_v102_1_sentinel",
    "super_glue_wsc_v102_simple_1_sentinel_eval",
    "super_glue_wsc_v102_simple_1_sentinel_train",
    "super_glue_wsc_v102_simple_eval",
    "super_glue_wsc_v102_simple_train",
    "trivia_qa_v010",
    "wikipedia_20190301.en_v003_unsupervised",
    "wmt14_ende_v003",
    "wmt14_enfr_v003",
    "wmt15_enfr_v003",
    "wmt16_enro_v003",
    "wmt19_ende_v003",
    "wmt_t2t_ende_v003",
    "wsc_dpr_simple_proportional",
)

# The vocabularies the names above read:
# seqio.ByteVocabulary: pad, eos, unk and the 256 bytes, no sentinels.
BYTE_VOCAB_SIZE = 259
# This package's SentencePiece vocabulary (data/vocab.py): this many pieces
# by default (gin th_data.vocabulary_options.size), plus EXTRA_IDS sentinels.
LOCAL_PIECES = 8000
EXTRA_IDS = 100
# t5's (gs://t5-data/vocabs/cc_all.32000*): 32000 pieces + 100 sentinels;
# th_finetune_squad_glue_superglue mixes t5's tasks.
T5_VOCAB_SIZE = 32100
T5_VOCAB_NAMES = T5 + ("th_finetune_squad_glue_superglue",)


def vocabulary_size(name, pieces=LOCAL_PIECES):
  """Ids of `name`'s vocabulary (before mtf pads it), or None for a name
  registered elsewhere.

  Args:
    name: a task or mixture name.
    pieces: th_data.vocabulary_options.size (this package's vocabulary).

  Example:
    vocabulary_size("th_lm_bytes") == 259
    vocabulary_size("th_span_corruption") == 8100
  """
  if name in T5_VOCAB_NAMES:
    return T5_VOCAB_SIZE
  if name not in THIS_PACKAGE:
    return None
  return BYTE_VOCAB_SIZE if name.endswith("_bytes") else pieces + EXTRA_IDS
