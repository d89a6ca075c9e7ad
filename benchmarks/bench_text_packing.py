"""Text packing time against corpus size: `pack_documents` on one paragraph of 0.5 ... 8 MB (issue 25, defect 7).

The baseline, measured in the same run, is encoding the text to token ids once (the least any packing must do),
so a linear `pack_documents` keeps a constant ratio to it as the paragraph grows; the quadratic one (cutting the
head off the token stream after every block) took 2.2 / 9.6 / 40.6 / 171 s at 0.5 / 1 / 2 / 4 MB.

Usage:  python benchmarks/bench_text_packing.py [--sizes-mb 0.5 1 2 4 8] [--seq-len 128]
Writes benchmarks/results/bench_text_packing.md.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

from measure import interleaved_times  # benchmarks/measure.py

from zpx_hf.tokenization_bytes import text_to_ids
from zpx_hf_train.data_tasks import pack_documents

RESULTS = Path(__file__).resolve().parent / "results"
SENTENCE = "The quick brown fox jumps over the lazy dog; "


def best_of(repeats: int, runs: dict) -> dict[str, float]:
    """Fastest of `repeats` interleaved rounds per run (the least the work takes: noise only adds time)."""
    times, errors = interleaved_times(runs, rounds=repeats, warmup=0)
    if errors:
        raise RuntimeError(str(errors))
    return {name: min(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[0.5, 1, 2, 4, 8])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="smoke run: one small paragraph, prints only")
    args = parser.parse_args()
    if args.quick:
        args.sizes_mb, args.repeats = [0.05], 1
    rows = []
    for size in args.sizes_mb:
        paragraph = (SENTENCE * (int(size * 1e6) // len(SENTENCE) + 1))[: int(size * 1e6)]
        best = best_of(
            args.repeats,
            {
                "encode": lambda text=paragraph: text_to_ids(text),
                "pack": lambda text=paragraph: pack_documents([text], args.seq_len),
            },
        )
        encode, pack = best["encode"], best["pack"]
        rows.append((size, encode, pack))
        print(f"{size:g} MB: encode {encode:.3f} s, pack {pack:.3f} s, ratio {pack / encode:.1f}", flush=True)
    if args.quick:
        return
    lines = [
        f"Measured by `python benchmarks/bench_text_packing.py` on {time.strftime('%Y-%m-%d')} ({platform.machine()}, "
        f"Python {platform.python_version()}, best of {args.repeats}), one paragraph, seq_len {args.seq_len}:",
        "",
        "| paragraph | encode once (s) | pack_documents (s) | pack / encode |",
        "|---|---|---|---|",
    ]
    lines += [f"| {size:g} MB | {encode:.3f} | {pack:.3f} | {pack / encode:.1f} |" for size, encode, pack in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_text_packing.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
