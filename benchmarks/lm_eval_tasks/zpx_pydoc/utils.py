"""Documents and per-document metrics of the `zpx_pydoc` lm-eval task (see zpx_pydoc.yaml)."""

from __future__ import annotations

import re
from typing import Any

HELDOUT_FRACTION, SPLIT_SEED = 0.1, 0  # the ablation's held-out split (benchmarks/evidence/tasks.py: text_blocks)


def heldout_documents(**kwargs: Any) -> Any:
    """{"test": Dataset with one `text` per held-out pydoc document}; lm-eval passes the task metadata as kwargs."""
    from datasets import Dataset, DatasetDict

    from zpx_hf_train.data_tasks import pydoc_documents, split_documents

    _, heldout = split_documents(pydoc_documents(), HELDOUT_FRACTION, seed=SPLIT_SEED)
    return DatasetDict({"test": Dataset.from_dict({"text": list(heldout)})})


def process_results(doc: dict, results: list) -> dict:
    """(log-likelihood, count) pairs, aggregated by lm-eval into word/byte perplexity and bits per byte."""
    (loglikelihood,) = results
    words = len(re.split(r"\s+", doc["text"]))
    num_bytes = len(doc["text"].encode("utf-8"))
    return {
        "word_perplexity": (loglikelihood, words),
        "byte_perplexity": (loglikelihood, num_bytes),
        "bits_per_byte": (loglikelihood, num_bytes),
    }
