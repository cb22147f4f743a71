"""Checkers for the notebooks' exercises, one module per notebook, one way to report.

A checker takes the learner's answer (a value, or a function it runs against llmlab's own) and
returns a :class:`Verdict`: ``ok`` and the one line a notebook shows, ``correct: ...``, ``not yet:
...`` (what is off, with a hint that does not give the whole answer away) or ``no answer yet: ...``
(the placeholder a notebook starts with). A checker prints nothing; a cell that ends with the call
shows the line. A verdict is true when the answer is correct.

An exercise in a notebook's source (``notebooks/src/NN_name.py``) is two cells:

* the learner's cell: a placeholder (``my_answer = None``, a function whose body is ``...``), then
  the checker call, which shows ``no answer yet`` or ``not yet`` until the learner fills it in;
* the solution cell, tagged ``solution`` (:data:`SOLUTION_TAG`) and collapsed
  (``jupyter.source_hidden``), which ends with the same checker call on the answer.

``make notebooks`` runs the source, solutions included, and fails when a solution cell does not show
``correct``. It stores the teacher's edition (every cell) in ``build/teacher/`` and commits the
learner's edition, the notebook without the cells tagged ``solution`` (``llmlab.nb.runner``): its
checker cells show ``no answer yet``, and no later cell may need a name only a solution defines.

=============  ===============================
module         notebook
=============  ===============================
``overview``   00_overview
``gguf``       01_gguf_bytes
``tokenizers`` 02_tokenizer
``attention``  03_attention_and_heads
``kv_cache``   04_kv_cache
``quant``      05_quant_blocks
``graph``      06_cgraph_and_scheduler
``mmvq``       07_dp4a_mmvq
``generation`` 08_full_generation
=============  ===============================

    from llmlab.nb import exercises as ex
    ex.check_kv_head(9, 3, 7, my_answer)      # shows "correct: ..." or "not yet: ..."
"""
from .attention import (check_attention_row, check_kq_bytes, check_kv_bytes_per_token, check_kv_head,
                        check_mla_cache_row, check_rms_norm, check_rope, check_stream, check_swiglu)
from .generation import check_greedy_loop, check_repeat_penalty, check_top_p
from .gguf import check_kv_pair, check_tensor_file_offset, check_tensor_nbytes
from .graph import (check_added_arch, check_first_offloaded, check_moe_decode_bytes, check_mul_mat_flops,
                    check_set_tensor_bytes, check_splits)
from .kv_cache import check_context_shift, check_find_slot
from .mmvq import check_dp4a, check_lanes, check_launch
from .overview import check_arithmetic_intensity, check_decode_tokens_per_s, check_forward_passes, check_kv_cache_bytes
from .quant import check_bits_per_weight, check_q4_1_block, check_q8_0_decode
from .tokenizers import check_next_bpe_merge, check_segmentation, check_unigram, check_wordpiece
from .verdict import SOLUTION_TAG, Verdict, is_correct, is_not_yet

__all__ = [
    "SOLUTION_TAG", "Verdict", "is_correct", "is_not_yet",
    "check_forward_passes", "check_decode_tokens_per_s", "check_arithmetic_intensity",      # 00
    "check_kv_cache_bytes",                                                                   # 04
    "check_kv_pair", "check_tensor_nbytes", "check_tensor_file_offset",                      # 01
    "check_next_bpe_merge", "check_segmentation", "check_wordpiece", "check_unigram",        # 02
    "check_attention_row", "check_kv_head", "check_kq_bytes", "check_kv_bytes_per_token",    # 03
    "check_rms_norm", "check_rope", "check_swiglu", "check_stream", "check_mla_cache_row",   # 03
    "check_find_slot", "check_context_shift",                                                # 04
    "check_q4_1_block", "check_bits_per_weight", "check_q8_0_decode",                        # 05
    "check_first_offloaded", "check_splits", "check_mul_mat_flops", "check_set_tensor_bytes",  # 06
    "check_moe_decode_bytes", "check_added_arch",                                            # 06
    "check_launch", "check_dp4a", "check_lanes",                                             # 07
    "check_top_p", "check_repeat_penalty", "check_greedy_loop",                              # 08
]
