"""The tokenizer's BOS behaviour is what it reports, before and after a reload (loading it where the package is not
installed: `test_edges_without_package.py`; lm-eval's rolling log-likelihood with no log p(<s> | <s>) term:
`test_edges_lm_eval.py`)."""

from __future__ import annotations

from transformers import AutoTokenizer

import zpx_hf  # noqa: F401
from zpx_hf.tokenization_bytes import BOS_ID, build_byte_tokenizer, text_to_ids

TEXT = "geometric attention"


def test_bos_behaviour_matches_what_the_tokenizer_reports(tmp_path):
    built = build_byte_tokenizer()
    built.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    with_bos = AutoTokenizer.from_pretrained(tmp_path, add_bos_token=True)
    for tokenizer, reports in ((built, False), (reloaded, False), (with_bos, True)):
        assert tokenizer.add_bos_token is reports
        expected = ([BOS_ID] if reports else []) + text_to_ids(TEXT)
        assert tokenizer(TEXT)["input_ids"] == expected
        assert tokenizer(TEXT, add_special_tokens=False)["input_ids"] == text_to_ids(TEXT)
