"""Packing benchmark: one training step (forward + backward) on the same documents, padded vs packed.

The documents (`--documents` of random lengths in [`--min-length`, `--max-length`], seeded) run as one
right-padded batch with an attention mask (what a padding collator gives) and as one packed row with
restarting `position_ids` (what `DataCollatorWithFlattening` and TRL's packing give): equal real tokens.
Both modes alternate inside one process, rounds after a warm-up; the table gives the median step time
and the packed / padded ratio measured in that run (median of the per-round ratios), per family, per
Versor mixer (`versor-gpa`, `versor-rra`, `versor-hybrid`) and for a same-size `LlamaForCausalLM`.

Usage:  python benchmarks/bench_packing.py [--families zpx pct versor-gpa llama] [--rounds 7]
Writes benchmarks/results/bench_packing.md and .csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from measure import interleaved_times, median_ratio, medians  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"
VERSOR_MIXERS = ["versor-gpa", "versor-rra", "versor-hybrid"]
NAMES = {
    "zpx": "ZPXForCausalLM",
    "pct": "PCTForCausalLM",
    "llama": "LlamaForCausalLM",
    **{name: f"VersorForCausalLM, mixer {name.removeprefix('versor-')}" for name in VERSOR_MIXERS},
}


def build_model(family: str, args: argparse.Namespace):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    import zpx_hf

    size = dict(
        vocab_size=260,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        max_position_embeddings=max(2048, args.max_length),
    )
    if family == "llama":
        config = LlamaConfig(**size, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    elif family.startswith("versor-"):  # one Versor model per mixer: versor-gpa, versor-rra, versor-hybrid
        config = zpx_hf.VersorConfig(**size, mixer=family.removeprefix("versor-"))
    else:
        config = zpx_hf.FAMILIES[family][0](**size)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()


def batches(args: argparse.Namespace) -> tuple[dict, dict, int]:
    """(padded batch, packed batch, real tokens) over the same documents."""
    import torch
    from transformers import DataCollatorWithFlattening

    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(args.min_length, args.max_length + 1, (args.documents,), generator=g).tolist()
    docs = [torch.randint(3, 260, (n,), generator=g) for n in lengths]
    longest = max(lengths)
    ids = torch.zeros(len(docs), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, doc in enumerate(docs):
        ids[row, : len(doc)], mask[row, : len(doc)] = doc, 1
    padded = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
    packed = DataCollatorWithFlattening(return_tensors="pt")([{"input_ids": d.tolist()} for d in docs])
    return padded, dict(packed), sum(lengths)


def add_size_arguments(parser: argparse.ArgumentParser, documents: int, max_length: int) -> None:
    """The documents, model sizes and rounds both this benchmark and bench_padded_regression.py take."""
    parser.add_argument("--documents", type=int, default=documents)
    parser.add_argument("--min-length", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=max_length)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, prints only")


def quick_sizes(args: argparse.Namespace) -> None:
    """`--quick`: a smoke run's tiny sizes."""
    if args.quick:
        args.documents, args.min_length, args.max_length, args.rounds = 4, 8, 32, 1


def setting(args: argparse.Namespace, script: str) -> str:
    """The first words of a results file: the documents, the model sizes and the command run."""
    command = " ".join([f"python benchmarks/{script}", *sys.argv[1:]])
    return (
        f"{args.documents} documents of {args.min_length}-{args.max_length} tokens (seed {args.seed}), hidden "
        f"{args.hidden}, {args.layers} layers, {args.heads} heads, sdpa, fp32, CPU, {args.threads} thread(s); "
        f"`{command}`"
    )


def write_results(name: str, rows: list[dict], lines: list[str]) -> None:
    """benchmarks/results/<name>.csv (the rows) and .md (the lines), printed too."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"{name}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def step(model, batch: dict) -> None:
    loss = model(**batch, use_cache=False).loss
    loss.backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="+", default=["zpx", "pct", *VERSOR_MIXERS, "llama"])
    add_size_arguments(parser, documents=16, max_length=512)
    args = parser.parse_args()
    quick_sizes(args)

    import torch

    torch.set_num_threads(args.threads)
    padded, packed, real = batches(args)
    rows = []
    for family in args.families:
        model = build_model(family, args)
        runs = {"padded": lambda m=model: step(m, padded), "packed": lambda m=model: step(m, packed)}
        times, errors = interleaved_times(runs, rounds=args.rounds, warmup=1)
        if errors:
            raise RuntimeError(f"{family}: {errors}")
        padded_ms, packed_ms = (medians(times)[mode] * 1e3 for mode in ("padded", "packed"))
        rows.append(
            {
                "family": family,
                "real_tokens": real,
                "padded_tokens": padded["input_ids"].numel(),
                "padded_ms": round(padded_ms, 1),
                "packed_ms": round(packed_ms, 1),
                "packed_over_padded": round(median_ratio(times, "packed", "padded"), 3),
            }
        )
        print(rows[-1], flush=True)
    if args.quick:
        return

    lines = [
        f"Training step (forward + backward), {setting(args, 'bench_packing.py')}. Padded: one right-padded batch "
        "with an attention mask; packed: one row from `DataCollatorWithFlattening` (restarting position_ids). Median "
        f"of {args.rounds} interleaved rounds in one process; packed / padded is the median of the per-round "
        "ratios.",
        "",
        "| model | real tokens | padded tokens | padded ms | packed ms | packed / padded |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {NAMES.get(row['family'], row['family'])} | {row['real_tokens']:,} | {row['padded_tokens']:,} | "
            f"{row['padded_ms']:.1f} | {row['packed_ms']:.1f} | {row['packed_over_padded']:.2f}x |"
        )
    write_results("bench_packing", rows, lines)


if __name__ == "__main__":
    main()
