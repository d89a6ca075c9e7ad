"""Text packing time against corpus size: `pack_documents` on one paragraph of 0.5 ... 8 MB (issue 25, defect 7).

The baseline, measured in the same run, is encoding the text to token ids once (the least any packing must do),
so a linear `pack_documents` keeps a constant ratio to it as the paragraph grows; the quadratic one (cutting the
head off the token stream after every block) took 2.2 / 9.6 / 40.6 / 171 s at 0.5 / 1 / 2 / 4 MB.

Times are medians of interleaved rounds and pack / encode the median of the per-round ratios, as every benchmark
measures (benchmarks/measure.py).

Usage:  python benchmarks/bench_text_packing.py [--sizes-mb 0.5 1 2 4 8] [--seq-len 128]
Writes benchmarks/results/bench_text_packing.md.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

from measure import interleaved_times, median_ratio, medians  # benchmarks/measure.py

from zpx_hf.tokenization_bytes import text_to_ids
from zpx_hf_train.data_tasks import pack_documents

RESULTS = Path(__file__).resolve().parent / "results"
SENTENCE = "The quick brown fox jumps over the lazy dog; "


def measure_packing(repeats: int, runs: dict) -> tuple[float, float, float]:
    """(encode s, pack s, pack / encode): medians of `repeats` interleaved rounds, the ratio the median of the
    per-round ratios (benchmarks/measure.py)."""
    times, errors = interleaved_times(runs, rounds=repeats, warmup=0)
    if errors:
        raise RuntimeError(str(errors))
    seconds = medians(times)
    return seconds["encode"], seconds["pack"], median_ratio(times, "pack", "encode")


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
        encode, pack, ratio = measure_packing(
            args.repeats,
            {
                "encode": lambda text=paragraph: text_to_ids(text),
                "pack": lambda text=paragraph: pack_documents([text], args.seq_len),
            },
        )
        rows.append((size, encode, pack, ratio))
        print(f"{size:g} MB: encode {encode:.3f} s, pack {pack:.3f} s, ratio {ratio:.1f}", flush=True)
    if args.quick:
        return
    lines = [
        f"Measured by `python benchmarks/bench_text_packing.py` on {time.strftime('%Y-%m-%d')} ({platform.machine()}, "
        f"Python {platform.python_version()}, median of {args.repeats} interleaved rounds; pack / encode = median "
        f"of the per-round ratios), one paragraph, seq_len {args.seq_len}:",
        "",
        "| paragraph | encode once (s) | pack_documents (s) | pack / encode |",
        "|---|---|---|---|",
    ]
    lines += [f"| {size:g} MB | {encode:.3f} | {pack:.3f} | {ratio:.1f} |" for size, encode, pack, ratio in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_text_packing.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
