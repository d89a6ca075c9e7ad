"""Speed and memory of every attention path, forward + backward, over sequence lengths.

    python benchmarks/bench_attention.py                       # CPU, and CUDA too when one is present
    python benchmarks/bench_attention.py --devices cuda --lengths 1024 4096 16384
    python benchmarks/bench_attention.py --quick               # smoke run: tiny sizes, prints only

Paths (one head layout for all: B=1, H=2 on CPU / B=2, H=8 on CUDA, 64 features per head, causal):
  softmax_sdpa      torch SDPA softmax attention (the baseline; flash/efficient kernels where available)
  zpx_materialised  ZPX's score term by term (docs/design.md §3.3): [L, L, C], [L, L, C, 3] tensors (C = 4)
  zpx_sdpa          ZPX as SDPA on the augmented head dim d + 5C (exact)
  pct_reference     PCT sigmoid attention, kernel "panel": the PyTorch path (query panels; real head dim 2d = 64)
  pct_triton        PCT fused Triton kernels (CUDA)
  gpa_reference     Versor GPA naive: [L, L, 11] score products materialised (2 multivector channels)
  gpa_chunked       Versor GPA O(L) PyTorch path: query panels, causal key blocks, online softmax
  gpa_triton        Versor GPA fused Triton kernels (CUDA)
  rra_scan          Versor RRA: closed-form rotors, log-depth scan (Triton scan on CUDA), sandwich; compact

Each point runs in a fresh subprocess and is measured as every benchmark measures (benchmarks/measure.py):
wall time = median of `--repeats` calls after a warm-up (CUDA synchronised), taking turns with softmax_sdpa
at the same shape and dtype (the ratio x SDPA = median of the per-round ratios); peak memory = growth of the
worker's peak RSS over its RSS before the op's first call (CPU), `torch.cuda.max_memory_allocated` over
the inputs (CUDA). CPU: fp32; CUDA: bf16 (RRA runs in fp32 by design). A path stops at the first length that fails (e.g.
out of memory) or takes longer than `--max-seconds`. Writes benchmarks/results/bench_attention.csv,
bench_attention.md and bench_attention.png (log-log time and memory vs length).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from measure import interleaved_times, median_ratio, medians, peak_memory, run_worker  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"
PATHS = (
    "softmax_sdpa",
    "zpx_materialised",
    "zpx_sdpa",
    "pct_reference",
    "pct_triton",
    "gpa_reference",
    "gpa_chunked",
    "gpa_triton",
    "rra_scan",
)
KERNEL_PATHS = ("pct_triton", "gpa_triton")
BASELINE = "softmax_sdpa"
HEAD_FEATURES, PHASE_CHANNELS = 64, 4


def zpx_op(kernel: str) -> Callable[..., Any]:
    """fn(q, k, v, pre, padding_mask=None) -> the output [B, L, H, d] of one causal ZPX attention call on q, k, v
    [B, H, L, d], its inputs made as the model makes them (modeling_zpx): phase features from the encoder's
    pre-activations `pre` = (log_r, theta, b), each [B, H, L, C] (max log-radius 4), keys k^ = [k, features],
    the same features for the queries, lambdas 1, scaling 1/sqrt(d). The package is imported here, before any
    measured call (an import inside the first call would count in its peak memory). Shared by
    bench_zpx_memory.py and gpu_check.py."""
    import torch

    from zpx_hf.ops_zpx import phase_coordinates, phase_key_features, zpx_attention

    def call(query: Any, key: Any, value: Any, pre: Any, padding_mask: Any = None) -> Any:
        features = phase_key_features(phase_coordinates(*pre, 4.0)).to(query.dtype)
        output, _ = zpx_attention(
            query,
            torch.cat((key, features), -1),
            value,
            features,
            key_padding_mask=padding_mask,
            causal=True,
            scaling=query.shape[-1] ** -0.5,
            lambda_angle=1.0,
            lambda_sphere=1.0,
            kernel=kernel,
        )
        return output

    return call


def make_step(path: str, length: int, device: str, dtype: Any, batch: int, heads: int) -> Callable[[], None]:
    """A closure running one forward + backward of `path` on fresh-looking inputs (made once)."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    d = HEAD_FEATURES

    def make(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=device, dtype=torch.float32) * scale).to(dtype).requires_grad_(True)

    if path == "softmax_sdpa":
        q, k, v = (make(batch, heads, length, d) for _ in range(3))

        def run() -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    elif path in ("zpx_materialised", "zpx_sdpa"):
        op = zpx_op("naive" if path == "zpx_materialised" else "panel")
        q, k, v = (make(batch, heads, length, d) for _ in range(3))
        pre = [make(batch, heads, length, PHASE_CHANNELS) for _ in range(3)]

        def run() -> Any:
            return op(q, k, v, pre)

    elif path in ("pct_reference", "pct_triton"):
        from zpx_hf.ops_pct import pct_attention

        kernel = "panel" if path == "pct_reference" else "triton"
        q, k = make(batch, heads, length, d, scale=d**-0.5), make(batch, heads, length, d, scale=d**-0.5)
        v = make(batch, heads, length, d)
        tau = torch.full((heads,), d**0.5 / 2**0.5, device=device, requires_grad=True)
        bias = torch.full((heads,), -5.0, device=device, requires_grad=True)

        def run() -> Any:
            return pct_attention(q, k, v, tau, bias, causal=True, kernel=kernel)

    elif path in ("gpa_reference", "gpa_chunked", "gpa_triton"):
        from zpx_hf.ops_gpa import geometric_product_attention

        kernel = {"gpa_reference": "naive", "gpa_chunked": "chunk", "gpa_triton": "triton"}[path]
        q, k, v = (make(batch, heads, length, d, scale=0.5) for _ in range(3))
        gamma = torch.full((heads,), 0.1, device=device, requires_grad=True)

        def run() -> Any:
            return geometric_product_attention(q, k, v, gamma, causal=True, kernel=kernel)

    elif path == "rra_scan":
        from zpx_hf.ops_rra import recursive_rotor_accumulator

        bivectors = make(batch, length, heads, 10, scale=0.1)
        values = make(batch, length, heads, d // 32, 32)

        def run() -> Any:
            return recursive_rotor_accumulator(bivectors, values, kernel="auto")[0]

    else:
        raise ValueError(f"unknown path {path!r}; expected one of {PATHS}.")

    def step() -> None:
        run().float().sum().backward()

    return step


def worker(path: str, length: int, device: str, batch: int, heads: int, repeats: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    dtype = torch.bfloat16 if device == "cuda" and path != "rra_scan" else torch.float32
    step = make_step(path, length, device, dtype, batch, heads)
    peak = peak_memory(step, device)  # before the timed calls: a warm-up would hide the CPU peak (measure.py)
    runs = {path: step}
    if path != BASELINE:  # the baseline takes turns with the path in the same rounds, same shape and dtype
        runs[BASELINE] = make_step(BASELINE, length, device, dtype, batch, heads)
    times, errors = interleaved_times(runs, rounds=repeats, warmup=1, device=device)
    if errors:  # the cause, not a KeyError on the missing median
        raise RuntimeError("; ".join(f"{name}: {error}" for name, error in errors.items()))
    return {
        "ms": medians(times)[path] * 1e3,
        "x_sdpa": median_ratio(times, path, BASELINE),
        "peak_mib": peak / 2**20,
        "dtype": str(dtype).replace("torch.", ""),
    }


def run_point(spec: list[Any], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = run_worker(__file__, spec, timeout=timeout, env=env)
    if "error" in result:
        return {"status": "failed: " + result["error"][:120]}
    return {"status": "ok", **result}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = sorted({r["device"] for r in rows})
    fig, axes = plt.subplots(len(devices), 2, figsize=(11, 4 * len(devices)), dpi=100, squeeze=False)
    for (ax_t, ax_m), device in zip(axes, devices):
        for name in PATHS:
            pts = [r for r in rows if r["device"] == device and r["path"] == name and r["status"] == "ok"]
            if not pts:
                continue
            xs = [r["L"] for r in pts]
            style = "--" if name in ("zpx_materialised", "gpa_reference") else "-"
            ax_t.plot(xs, [r["ms"] for r in pts], style, marker="o", label=name)
            ax_m.plot(xs, [max(r["peak_mib"], 1e-2) for r in pts], style, marker="o", label=name)
        for ax, label in ((ax_t, "forward + backward ms"), (ax_m, "peak memory MiB")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length")
            ax.set_ylabel(label)
            ax.set_title(f"{device}: {label}")
            ax.grid(alpha=0.3, which="both")
        ax_t.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"Command: `{meta['command']}` — {meta['date']} — {meta['machine']}.",
        "",
        "Forward + backward of one attention op, causal, 64 features per head "
        "(ZPX: + 5 x 4 phase features; PCT: complex d = 32; GPA/RRA: 2 multivector channels). "
        "Cells: time ms (x softmax SDPA) / peak MiB; the ratio is the median of per-round ratios to softmax SDPA "
        "at the same shape and dtype, timed in turns with the path in its worker. CPU times are wall-clock "
        "medians on a machine that may be shared (noisy, compare orders of magnitude); CPU memory is the "
        "peak-RSS growth of a fresh process.",
    ]
    for device in sorted({r["device"] for r in rows}):
        sub = [r for r in rows if r["device"] == device]
        lengths = sorted({r["L"] for r in sub})
        shape = meta["shapes"][device]
        lines += [
            "",
            f"**{device}** (B={shape['batch']}, H={shape['heads']}, {shape['dtype']}):",
            "",
            "| path | " + " | ".join(f"L={n}" for n in lengths) + " |",
            "|---|" + "---:|" * len(lengths),
        ]
        for name in PATHS:
            cells, seen = [], False
            for n in lengths:
                r = next((r for r in sub if r["path"] == name and r["L"] == n), None)
                if r is None:
                    cells.append("-")
                    continue
                seen = True
                if r["status"] == "ok":
                    cells.append(f"{r['ms']:.1f} ({r['x_sdpa']:.2f}x) / {r['peak_mib']:.0f}")
                else:
                    cells.append(r["status"].split(":")[0])
            if seen:
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
    skipped = meta.get("skipped")
    if skipped:
        lines += ["", "Not measured: " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", nargs="+", default=None, help="cpu and/or cuda (default: cpu + cuda if present)")
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=60.0, help="per-point wall-clock limit")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--tag", default="bench_attention")
    parser.add_argument("--quick", action="store_true", help="smoke run: L = 64, 128, 2 repeats, prints only")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.repeats = args.lengths or [64, 128], 2

    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(worker(*spec)))
        return

    import datetime
    import platform

    import torch

    devices = args.devices or (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    default_lengths = {"cpu": [256, 512, 1024, 2048], "cuda": [1024, 2048, 4096, 8192, 16384]}
    shapes = {"cpu": (1, 2), "cuda": (2, 8)}
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    env = dict(os.environ)
    for device in devices:
        if device == "cuda" and not torch.cuda.is_available():
            skipped.append("cuda (no CUDA device)")
            continue
        batch, heads = shapes[device]
        for name in args.paths:
            if name in KERNEL_PATHS and device != "cuda" and env.get("TRITON_INTERPRET") != "1":
                skipped.append(f"{name} on {device} (Triton kernels need CUDA)")
                continue
            for length in args.lengths or default_lengths[device]:
                spec = [name, length, device, batch, heads, args.repeats]
                result = run_point(spec, timeout=args.max_seconds * (args.repeats + 2), env=env)
                rows.append({"device": device, "path": name, "L": length, **result})
                print(rows[-1], flush=True)
                if result["status"] != "ok" or result["ms"] * (args.repeats + 1) > args.max_seconds * 1e3:
                    break  # longer lengths only get worse

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    meta = {
        "command": " ".join(["python benchmarks/bench_attention.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}"
        + (f", {gpu}" if gpu else ""),
        "shapes": {
            d: {"batch": shapes[d][0], "heads": shapes[d][1], "dtype": "fp32" if d == "cpu" else "bf16 (RRA fp32)"}
            for d in devices
        },
        "skipped": skipped,
    }
    if args.quick:
        print(markdown(rows, meta))
        return
    args.output.mkdir(parents=True, exist_ok=True)
    stem = args.output / args.tag
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["device", "dtype", "path", "L", "ms", "x_sdpa", "peak_mib", "status"])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in writer.fieldnames})
    if any(r["status"] == "ok" for r in rows):
        plot(rows, stem.with_suffix(".png"))
    text = markdown(rows, meta)
    if stem.with_suffix(".png").exists():
        text += f"\n![attention benchmark](benchmarks/results/{stem.name}.png)\n"
    stem.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
