"""The tokenizer's BOS behaviour is what it reports, before and after a reload (loading it where the package is not
installed: `test_edges_without_package.py`; lm-eval's rolling log-likelihood with no log p(<s> | <s>) term:
`test_edges_lm_eval.py`)."""

from __future__ import annotations

import json

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
    # what the model-side files carry: tokenizer.json's post-processor adds nothing, as add_bos_token says
    post_processor = json.loads((tmp_path / "tokenizer.json").read_text())["post_processor"]
    assert (
        post_processor["single"] == [{"Sequence": {"id": "A", "type_id": 0}}] and not post_processor["special_tokens"]
    )


def test_a_saved_bos_copy_reloads_misreporting_as_the_readme_warns(tmp_path):
    # transformers 5 saves the BOS rule in tokenizer.json but not add_bos_token: the README says not to save such a
    # copy; this pins the reason (if it fails, transformers keeps add_bos_token now and the README can drop it)
    build_byte_tokenizer().save_pretrained(tmp_path / "plain")
    AutoTokenizer.from_pretrained(tmp_path / "plain", add_bos_token=True).save_pretrained(tmp_path / "bos")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "bos")
    assert reloaded.add_bos_token is False and reloaded(TEXT)["input_ids"] == [BOS_ID, *text_to_ids(TEXT)]
