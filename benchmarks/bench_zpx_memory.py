"""ZPX long-context memory and step-time benchmark (issue: ZPX foundation).

1. Attention op, forward + backward, at L = 512 ... 4096: the materialised form of docs/design.md §3.3
   (kernel `naive`, [L, L, C] and [L, L, C, 3] tensors) vs the exact augmented-head-dim
   SDPA form (kernel `panel`). Each point runs in a fresh subprocess; peak memory and wall-clock
   medians as every benchmark measures them (benchmarks/measure.py: the first call's peak RSS growth on
   the CPU, `torch.cuda.max_memory_allocated` above the inputs on CUDA).
   At `--padded-lengths` (default 16384) the fast form with one left-padded key (a padding mask) against
   none, one timed round each: the padded path builds masks per query panel, never L x L,
   so its peak stays within 2x. Written to zpx_memory_padded_<device>.md; `--padded-only` runs just these.
2. One training step (forward + backward + AdamW) of `ZPXForCausalLM` vs `LlamaForCausalLM` of
   the same size, both on SDPA, taking turns in one process; ratio = median of the per-round ratios.

Usage:  python benchmarks/bench_zpx_memory.py [--lengths 512 1024 2048 4096] [--device cpu|cuda]
Writes benchmarks/results/zpx_memory_<device>.md and .csv.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from bench_attention import zpx_op  # benchmarks/bench_attention.py
from measure import interleaved_times, median_ratio, medians, peak_memory, run_worker  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"


def attention_worker(
    path: str, length: int, device: str, heads: int, head_dim: int, channels: int, repeats: int = 3
) -> dict:
    """`path`: "materialised" (kernel naive), "sdpa" (kernel panel) or "sdpa-padded" (panel, one padded key)."""
    import torch

    torch.manual_seed(0)
    op = zpx_op("naive" if path == "materialised" else "panel")
    padding = None
    if path == "sdpa-padded":
        padding = torch.ones(1, length, dtype=torch.bool, device=device)
        padding[0, 0] = False
    dtype = torch.float32

    def make(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)

    q, k, v = make(1, heads, length, head_dim), make(1, heads, length, head_dim), make(1, heads, length, head_dim)
    pre = [make(1, heads, length, channels) for _ in range(3)]

    def step():
        op(q, k, v, pre, padding).sum().backward()

    peak = peak_memory(step, device)  # before any timing: see benchmarks/measure.py
    rounds = max(repeats, 1)  # repeats=0: one timed round (long padded points)
    times, errors = interleaved_times({"op": step}, rounds=rounds, warmup=0, device=device)
    if errors:
        raise RuntimeError(errors["op"])
    return {"ms": medians(times)["op"] * 1e3, "peak_mib": peak / 2**20}


def step_worker(device: str, length: int, batch: int) -> dict:
    """Llama and ZPX steps take turns in one process (fair under background load); median ms, and ZPX's ratio
    to Llama as the median of the per-round ratios."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from zpx_hf import ZPXConfig

    torch.manual_seed(0)
    size = dict(vocab_size=260, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4)
    llama_config = LlamaConfig(**size, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    zpx_config = ZPXConfig(**size, phase_channels=8, rotary="srpe")
    models = {}
    for name, config in (("llama", llama_config), ("zpx", zpx_config)):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(device).train()
        models[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
    ids = torch.randint(3, 260, (batch, length), device=device)

    def step(model, optimizer) -> None:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    runs = {name: (lambda pair=pair: step(*pair)) for name, pair in models.items()}
    times, errors = interleaved_times(runs, rounds=10, warmup=2, device=device)
    if errors:  # the worker's error names the model and the cause (else a KeyError on its missing median)
        raise RuntimeError("; ".join(f"{name}: {error}" for name, error in errors.items()))
    ms = medians(times)
    params = {name: sum(p.numel() for p in model.parameters()) for name, (model, _) in models.items()}
    return {
        name: {"ms": ms[name] * 1e3, "params": params[name], "ratio": median_ratio(times, name, "llama")}
        for name in runs
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--device", default="cuda" if _cuda() else "cpu")
    parser.add_argument("--padded-lengths", type=int, nargs="*", default=[16384])
    parser.add_argument("--padded-only", action="store_true", help="only the padded-vs-unpadded points")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--step-length", type=int, default=256)
    parser.add_argument("--step-batch", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, prints only")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        spec = json.loads(args.worker)
        result = attention_worker(*spec[1:]) if spec[0] == "attention" else step_worker(*spec[1:])
        print(json.dumps(result))
        return

    if args.quick:
        args.lengths, args.step_length, args.step_batch = [64, 128], 32, 2
        args.padded_lengths = [256]
    padded_rows = []
    for length in args.padded_lengths:
        for path in ("sdpa", "sdpa-padded"):
            spec = ["attention", path, length, args.device, args.heads, args.head_dim, args.channels, 0]
            padded_rows.append({"L": length, "path": path, **run_worker(__file__, spec, timeout=3600)})
            print(padded_rows[-1], flush=True)
    if padded_rows:
        lines = padded_table(padded_rows, args)
        print("\n".join(lines))
        if not args.quick:
            write_results(RESULTS / f"zpx_memory_padded_{args.device}", padded_rows, lines)
    if args.padded_only:
        return

    rows = []
    for length in args.lengths:
        for path in ("materialised", "sdpa"):
            spec = ["attention", path, length, args.device, args.heads, args.head_dim, args.channels]
            rows.append({"L": length, "path": path, **run_worker(__file__, spec)})
            print(rows[-1], flush=True)
    steps = run_worker(__file__, ["step", args.device, args.step_length, args.step_batch])
    if "error" in steps:
        steps = {"llama": steps, "zpx": steps}
    print(steps, flush=True)

    by = {(r["L"], r["path"]): r for r in rows}
    lines = [
        f"ZPX attention, forward + backward, B=1, H={args.heads}, d={args.head_dim}, C={args.channels}, fp32, "
        f"causal, device={args.device} (`python benchmarks/bench_zpx_memory.py`; CPU peak = growth over the RSS "
        "just before the first call).",
        "",
        "| L | materialised ms | materialised peak MiB | sdpa ms | sdpa peak MiB |",
        "|---:|---:|---:|---:|---:|",
    ]
    for length in args.lengths:
        m, s = by[(length, "materialised")], by[(length, "sdpa")]
        lines.append(
            f"| {length} | {cell(m, 'ms', '.1f')} | {cell(m, 'peak_mib', '.0f')} | "
            f"{cell(s, 'ms', '.1f')} | {cell(s, 'peak_mib', '.0f')} |"
        )
    llama, zpx = steps["llama"], steps["zpx"]
    lines += [
        "",
        f"Training step (forward + backward + AdamW), hidden 256, 4 layers, 4 heads, B={args.step_batch}, "
        f"L={args.step_length}, SDPA, device={args.device}:",
        "",
        "| model | params | median ms / step | ratio to Llama |",
        "|---|---:|---:|---:|",
    ]
    for name, result in (("LlamaForCausalLM", llama), ("ZPXForCausalLM (C=8, SRPE)", zpx)):
        if "ms" in result:
            lines.append(f"| {name} | {result['params']:,} | {result['ms']:.1f} | {result['ratio']:.2f}x |")
        else:
            lines.append(f"| {name} | - | failed ({result.get('error', '?')[:40]}) | - |")
    print("\n".join(lines))
    if not args.quick:
        write_results(RESULTS / f"zpx_memory_{args.device}", rows, lines)


def cell(row: dict, key: str, fmt: str) -> str:
    return format(row[key], fmt) if key in row else f"failed ({row.get('error', '?')[:40]})"


def write_results(stem: Path, rows: list[dict], lines: list[str]) -> None:
    """<stem>.csv (one row per point) and <stem>.md (the table)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["L", "path", "ms", "peak_mib", "error"])
        writer.writeheader()
        for row in rows:
            writer.writerow({key: row.get(key, "") for key in writer.fieldnames})
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


def padded_table(rows: list[dict], args: argparse.Namespace) -> list[str]:
    """zpx_memory_padded_<device>.md: the padded fast path's peak against the unpadded one."""
    by = {(r["L"], r["path"]): r for r in rows}
    lines = [
        f"ZPX attention (kernel `panel`), forward + backward, one call, B=1, H={args.heads}, d={args.head_dim}, "
        f"C={args.channels}, fp32, causal, device={args.device}: no padding vs one left-padded key (a [1, L] "
        "padding mask) (`python benchmarks/bench_zpx_memory.py --padded-only`; CPU peak = growth over the RSS "
        "just before the call).",
        "",
        "| L | unpadded peak MiB | padded peak MiB | padded / unpadded peak | unpadded ms | padded ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for length in args.padded_lengths:
        u, p = by[(length, "sdpa")], by[(length, "sdpa-padded")]
        ratio = f"{p['peak_mib'] / max(u['peak_mib'], 1.0):.2f}x" if "peak_mib" in u and "peak_mib" in p else "-"
        lines.append(
            f"| {length} | {cell(u, 'peak_mib', '.0f')} | {cell(p, 'peak_mib', '.0f')} | {ratio} | "
            f"{cell(u, 'ms', '.0f')} | {cell(p, 'ms', '.0f')} |"
        )
    return lines


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    main()
