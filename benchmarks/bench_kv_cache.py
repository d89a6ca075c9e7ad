"""KV-cache bytes per layer with grouped-query attention (`num_key_value_heads`), measured on the cache itself.

    python benchmarks/bench_kv_cache.py            # writes benchmarks/results/bench_kv_cache.md
    python benchmarks/bench_kv_cache.py --quick    # tiny sizes, prints only

One decoder layer per model (hidden 512, 8 query heads of 64 real features, ZPX with 8 phase channels, PCT
complex: 32 complex features per head; Versor GPA: 2 multivectors of 32 per head), float32, a prefill of
L = 1024 random tokens through `AutoModelForCausalLM` with the cache; the bytes are those of the cache layer's
own key and value tensors (`DynamicCache`; Versor's `VersorCache`), so ZPX's keys count as the
k^ = [k, cos phi, sin phi, s] it stores (d + 5C wide). Exact counts, not timings: the numbers do not depend on
the machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import zpx_hf

RESULTS = Path(__file__).resolve().parent / "results"
CASES = (("zpx", dict(phase_channels=8)), ("pct", {}), ("versor", dict(mixer="gpa")))


def cache_bytes(family: str, extra: dict, key_heads: int, size: dict) -> tuple[int, tuple[int, ...]]:
    """(bytes of layer 0's cached keys + values, the keys' shape) after a prefill of `size["length"]` tokens."""
    config = zpx_hf.FAMILIES[family][0](
        vocab_size=260,
        hidden_size=size["hidden"],
        intermediate_size=size["hidden"],
        num_hidden_layers=1,
        num_attention_heads=size["heads"],
        num_key_value_heads=key_heads,
        max_position_embeddings=size["length"],
        **extra,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(3, 260, (1, size["length"]))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    if hasattr(cache, "layers"):  # DynamicCache
        keys, values = cache.layers[0].keys, cache.layers[0].values
    else:  # Versor's own cache: GPA keys and values per layer
        keys, values = cache.keys[0], cache.values[0]
    total = sum(t.numel() * t.element_size() for t in (keys, values))
    return total, tuple(keys.shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, print only")
    args = parser.parse_args()
    size = dict(hidden=64, heads=4, length=32) if args.quick else dict(hidden=512, heads=8, length=1024)
    rows = []
    for family, extra in CASES:
        full = None
        for key_heads in (size["heads"], size["heads"] // 4, 1):
            total, shape = cache_bytes(family, extra, key_heads, size)
            full = full or total
            cells = (family, size["heads"], key_heads, list(shape), f"{total:,}", f"{total / full:.3f}")
            rows.append("| " + " | ".join(map(str, cells)) + " |")
    lines = [
        f"KV-cache bytes of one layer after a prefill of L = {size['length']} tokens (batch 1, float32; "
        f"hidden {size['hidden']}, {size['heads']} query heads of {size['hidden'] // size['heads']}; "
        "`python benchmarks/bench_kv_cache.py`).",
        "",
        "| family | query heads | key-value heads | cached keys [B, Hkv, L, width] | bytes (keys + values) | vs full |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    print("\n".join(lines))
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "bench_kv_cache.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
