"""One GPU session: build every Triton kernel, check it against the PyTorch reference, benchmark it.

    python benchmarks/gpu_check.py                 # < 8 min on one H200; writes benchmarks/results/gpu_check.md
    python benchmarks/gpu_check.py --quick         # correctness only, smaller shapes

Checks (forward and every gradient, odd lengths, causal and not, fp32 / fp16 / bf16):
  PCT sigmoid attention   pct_attention kernel 'triton' vs 'cpu'              grads q, k, v, tau, b (+ padding mask)
  Versor GPA              kernel 'triton' vs 'naive' (+ key padding, Lq < Lk) grads q, k, v, gamma
  Versor RRA              op 'triton' vs 'naive', compact + full (fp32)       grads bivectors, value, initial
  RRA stability           |R ~R - 1| after a 16,384-token rotation scan on the Triton path
  ZPX                     SDPA fast form (fp32/fp16/bf16) vs the materialised form in fp32 (no Triton kernel)
  models                  PCT and Versor models, attn_implementation "sdpa" (Triton) vs "eager": logits, grads

The reference always runs in fp32 on the same (rounded) inputs; the error of a tensor is
max |x - ref| / max |ref| (relative to its scale), with limits fp32 2e-3 (TF32 dots), fp16 1e-2, bf16 4e-2
for outputs and 2x that for gradients. Then `bench_attention.py`'s CUDA points (bf16) for every path.
Exit status 1 if any check fails; 0 with a clear message when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
LIMITS = {"float32": 2e-3, "float16": 1e-2, "bfloat16": 4e-2}
DEVICE = "cuda"  # `--interpret-on-cpu`: smoke-test this script on CPU under TRITON_INTERPRET=1 (tiny shapes)
SMOKE = False


def rel_error(actual: Any, expected: Any) -> float:
    expected = expected.detach().float()
    scale = float(expected.abs().max()) or 1.0
    return float((actual.detach().float() - expected).abs().max()) / scale


def compare(
    name: str,
    fn: Callable[..., Any],
    ref: Callable[..., Any],
    inputs: list[Any],
    grad_names: list[str],
    dtype: Any,
    rows: list[dict[str, Any]],
) -> None:
    """Forward + backward of `fn` on inputs cast to `dtype` (float params stay fp32) vs `ref` in fp32."""
    import torch

    def prepare(cast: Any) -> list[Any]:
        out = []
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                y = x.detach()
                if x.dim() >= 3:  # activations; per-head parameters stay fp32
                    y = y.to(cast)
                out.append(y.requires_grad_(x.requires_grad))
            else:
                out.append(x)
        return out

    low = prepare(dtype)
    high = [
        (
            x.detach().float().requires_grad_(x.requires_grad)
            if isinstance(x, torch.Tensor) and x.is_floating_point()
            else x
        )
        for x in low
    ]
    out, expected = fn(*low), ref(*high)
    grad = torch.randn_like(expected.float())
    out.float().backward(grad)
    expected.backward(grad)
    tag = str(dtype).replace("torch.", "")
    limit = LIMITS[tag]
    errors = {"out": rel_error(out, expected)}
    grads = [x for x in low if isinstance(x, torch.Tensor) and x.requires_grad]
    grads_ref = [x for x in high if isinstance(x, torch.Tensor) and x.requires_grad]
    for gname, a, b in zip(grad_names, grads, grads_ref):
        errors[gname] = rel_error(a.grad, b.grad)
    ok = errors["out"] <= limit and all(v <= 2 * limit for k, v in errors.items() if k != "out")
    rows.append({"check": name, "dtype": tag, "ok": ok, "errors": errors})
    print(f"{'PASS' if ok else 'FAIL'} {name} {tag} " + " ".join(f"{k}={v:.1e}" for k, v in errors.items()), flush=True)


def check_pct(rows: list[dict[str, Any]], dtypes: list[Any], quick: bool) -> None:
    import torch

    from zpx_hf.ops_pct import pct_attention

    shapes = [(1, 2, 1, 1, 32), (2, 3, 67, 67, 64), (1, 2, 300, 300, 128)] + ([] if quick else [(2, 4, 1031, 1031, 64)])
    shapes = shapes[:2] if SMOKE else shapes
    for batch, heads, lq, lk, dim in shapes:
        for causal in (True, False):
            for masked in (False, True) if lq > 1 else (False,):
                g = torch.Generator(device=DEVICE).manual_seed(lq + dim)
                q = torch.randn(batch, heads, lq, dim, device=DEVICE, generator=g) / dim**0.5
                k = torch.randn(batch, heads, lk, dim, device=DEVICE, generator=g) / dim**0.5
                v = torch.randn(batch, heads, lk, dim, device=DEVICE, generator=g)
                tau = torch.full((heads,), dim**0.5, device=DEVICE) + 0.1 * torch.arange(heads, device=DEVICE)
                bias = torch.full((heads,), -3.0, device=DEVICE)
                mask = None
                if masked:
                    mask = torch.ones(batch, lk, dtype=torch.bool, device=DEVICE)
                    mask[:, : lk // 5] = False
                for x in (q, k, v, tau, bias):
                    x.requires_grad_(True)
                for dtype in dtypes:
                    compare(
                        f"pct L={lq} D={dim} causal={causal} mask={masked}",
                        lambda *a, m=mask, c=causal: pct_attention(*a, causal=c, key_padding_mask=m, kernel="triton"),
                        lambda *a, m=mask, c=causal: pct_attention(*a, causal=c, key_padding_mask=m, kernel="panel"),
                        [q, k, v, tau, bias],
                        ["dq", "dk", "dv", "dtau", "dbias"],
                        dtype,
                        rows,
                    )


def check_gpa(rows: list[dict[str, Any]], dtypes: list[Any], quick: bool) -> None:
    from functools import partial

    import torch

    from zpx_hf.ops_gpa import geometric_product_attention

    gpa_naive = partial(geometric_product_attention, kernel="naive")
    gpa_triton = partial(geometric_product_attention, kernel="triton")

    shapes = [(1, 2, 1, 32), (2, 2, 67, 64), (1, 3, 300, 96)] + ([] if quick else [(2, 2, 1031, 64)])
    shapes = shapes[:2] if SMOKE else shapes
    for batch, heads, length, dim in shapes:
        for causal in (True, False):
            g = torch.Generator(device=DEVICE).manual_seed(length + dim)
            q, k, v = (torch.randn(batch, heads, length, dim, device=DEVICE, generator=g) * 0.5 for _ in range(3))
            gamma = torch.linspace(-0.5, 1.0, heads, device=DEVICE)
            for x in (q, k, v, gamma):
                x.requires_grad_(True)
            for dtype in dtypes:
                compare(
                    f"gpa L={length} D={dim} causal={causal}",
                    lambda *a, c=causal: gpa_triton(*a, causal=c),
                    lambda *a, c=causal: gpa_naive(*a, causal=c),
                    [q, k, v, gamma],
                    ["dq", "dk", "dv", "dgamma"],
                    dtype,
                    rows,
                )
    # decoding-shaped: Lq < Lk over a left-padded cache (rows with no visible key output zeros)
    q_len, k_len = (5, 40) if SMOKE else (37, 300)
    g = torch.Generator(device=DEVICE).manual_seed(7)
    q = torch.randn(2, 2, q_len, 64, device=DEVICE, generator=g) * 0.5
    k, v = (torch.randn(2, 2, k_len, 64, device=DEVICE, generator=g) * 0.5 for _ in range(2))
    gamma = torch.linspace(-0.5, 1.0, 2, device=DEVICE)
    padding = torch.ones(2, k_len, dtype=torch.bool, device=DEVICE)
    padding[0, : k_len - q_len + 2] = False  # the first two query rows of sequence 0 see no key
    for x in (q, k, v, gamma):
        x.requires_grad_(True)
    for dtype in dtypes:
        compare(
            f"gpa Lq={q_len} Lk={k_len} D=64 causal padded",
            lambda *a: gpa_triton(*a, causal=True, key_padding_mask=padding),
            lambda *a: gpa_naive(*a, causal=True, key_padding_mask=padding),
            [q, k, v, gamma],
            ["dq", "dk", "dv", "dgamma"],
            dtype,
            rows,
        )


def check_rra(rows: list[dict[str, Any]], quick: bool) -> None:
    import torch

    from zpx_hf.clifford_algebra import rotor_exp, rotor_norm_error, to_matrix
    from zpx_hf.ops_rra import recursive_rotor_accumulator

    def op(kernel: str, accumulate: str) -> Callable[..., Any]:
        def run(bivectors: Any, value: Any, initial: Any) -> Any:
            kwargs = dict(accumulate=accumulate, initial=initial, kernel=kernel)
            return recursive_rotor_accumulator(bivectors, value, **kwargs)[0]

        return run

    # (B, L, H): the whole op (closed-form rotors, Triton scan, sandwich) vs the sequential reference ('naive')
    cases = [(1, 1, 1), (2, 37, 3), (2, 513, 8)] + ([] if quick else [(4, 2049, 8)])
    for batch, length, heads in cases[:2] if SMOKE else cases:
        g = torch.Generator(device=DEVICE).manual_seed(length)
        bivectors = torch.tanh(torch.randn(batch, length, heads, 10, device=DEVICE, generator=g))
        value = torch.randn(batch, length, heads, 2, 32, device=DEVICE, generator=g)
        initial = rotor_exp(torch.randn(batch, heads, 10, device=DEVICE, generator=g) * 0.3)
        for accumulate in ("compact", "full"):
            scaled = bivectors.clone()
            if accumulate == "full":  # accumulated boosts grow without bound: keep them small
                scaled[..., 6:] *= 0.05
            compare(
                f"rra {accumulate} B={batch} L={length} H={heads}",
                op("triton", accumulate),
                op("naive", accumulate),
                [scaled.requires_grad_(True), value.requires_grad_(True), initial.requires_grad_(True)],
                ["dbivectors", "dvalue", "dinitial"],
                torch.float32,
                rows,
            )
    length = 64 if SMOKE else 16384
    bivectors = torch.tanh(torch.randn(8, length, 4, 10, device=DEVICE))
    with torch.no_grad():
        value = torch.zeros(8, length, 4, 1, 32, device=DEVICE)
        _, state = recursive_rotor_accumulator(bivectors, value, kernel="triton")
        drift = float(rotor_norm_error(to_matrix(state)).max())
    ok = drift < 1e-5
    rows.append(
        {"check": f"rra stability L={length} (compact)", "dtype": "float32", "ok": ok, "errors": {"RR~-1": drift}}
    )
    print(f"{'PASS' if ok else 'FAIL'} rra stability |R~R-1|={drift:.1e}", flush=True)


def check_zpx(rows: list[dict[str, Any]], dtypes: list[Any]) -> None:
    import torch
    from bench_attention import zpx_op  # this script's folder is on sys.path when run as a script

    batch, heads, length, dim, channels = (1, 2, 33, 64, 4) if SMOKE else (2, 4, 257, 64, 4)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, dim, device=DEVICE, generator=g) for _ in range(3))
    pre = [torch.randn(batch, heads, length, channels, device=DEVICE, generator=g) for _ in range(3)]
    for x in (q, k, v, *pre):
        x.requires_grad_(True)

    def run(kernel: str) -> Callable[..., Any]:
        op = zpx_op(kernel)
        return lambda q, k, v, *pre: op(q, k, v, pre)

    for dtype in dtypes:
        compare(
            f"zpx sdpa vs materialised L={length}",
            run("panel"),
            run("naive"),
            [q, k, v, *pre],
            ["dq", "dk", "dv", "dlog_r", "dtheta", "db"],
            dtype,
            rows,
        )


def check_models(rows: list[dict[str, Any]]) -> None:
    """Tiny models, same weights: attn_implementation 'sdpa' (Triton on CUDA) vs 'eager' (the references),
    fp32, logits and parameter grads."""
    import torch
    from transformers import AutoModelForCausalLM

    from zpx_hf import PCTConfig, VersorConfig

    ids = torch.randint(4, 260, (2, 17 if SMOKE else 97), device=DEVICE)
    cases = [("pct model", PCTConfig, {}), ("versor hybrid model", VersorConfig, {"mixer": "hybrid"})]
    for name, config_class, extra in cases:
        size = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}
        # one config each: from_config sets the implementation on the config it is given, so a shared config
        # would leave both models on the last one ("eager" vs "eager", an error of exactly 0)
        torch.manual_seed(0)
        model_fast = AutoModelForCausalLM.from_config(config_class(**size, **extra), attn_implementation="sdpa")
        model_slow = AutoModelForCausalLM.from_config(config_class(**size, **extra), attn_implementation="eager")
        model_fast, model_slow = model_fast.to(DEVICE), model_slow.to(DEVICE)
        model_slow.load_state_dict(model_fast.state_dict())
        out_fast = model_fast(input_ids=ids, labels=ids, use_cache=False)
        out_slow = model_slow(input_ids=ids, labels=ids, use_cache=False)
        out_fast.loss.backward()
        out_slow.loss.backward()
        errors = {"logits": rel_error(out_fast.logits, out_slow.logits)}
        grad_errors = [
            rel_error(a.grad, b.grad)
            for a, b in zip(model_fast.parameters(), model_slow.parameters())
            if a.grad is not None and b.grad is not None and float(b.grad.abs().max()) > 0
        ]
        errors["max param grad"] = max(grad_errors) if grad_errors else 0.0
        ok = errors["logits"] <= LIMITS["float32"] and errors["max param grad"] <= 5 * LIMITS["float32"]
        rows.append({"check": name, "dtype": "float32", "ok": ok, "errors": errors})
        print(f"{'PASS' if ok else 'FAIL'} {name} " + " ".join(f"{k}={v:.1e}" for k, v in errors.items()), flush=True)


def benchmark(lengths: list[int], rows: list[dict[str, Any]], after_each: Callable[[], Any]) -> None:
    """bench_attention's CUDA measurement in this process (bf16; RRA fp32), appended to `rows`."""
    import torch
    from bench_attention import PATHS, worker  # this script's folder is on sys.path when run as a script

    for path in PATHS:
        for length in lengths:
            if path in ("zpx_materialised", "gpa_reference") and length > 4096:
                rows.append({"path": path, "L": length, "status": "skipped (O(L^2) materialised; > 4096)"})
                continue
            try:
                result = worker(path, length, "cuda", 2, 8, 5)
                rows.append({"path": path, "L": length, "status": "ok", **result})
            except torch.OutOfMemoryError:
                rows.append({"path": path, "L": length, "status": "out of memory"})
            except Exception as error:  # recorded, the session continues
                rows.append({"path": path, "L": length, "status": f"failed: {type(error).__name__}"})
            torch.cuda.empty_cache()
            print(rows[-1], flush=True)
            after_each()


def report(checks: list[dict[str, Any]], bench: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    failed = [c for c in checks if not c["ok"]]
    lines = [
        f"Command: `{meta['command']}` — {meta['date']} — {meta['device']}, torch {meta['torch']}, "
        f"triton {meta['triton']}; {meta['minutes']:.1f} min ({meta['stage']}).",
        "",
        f"**Correctness: {len(checks) - len(failed)}/{len(checks)} checks pass.** Error = max |x - ref| / max |ref|, "
        "reference in fp32 on the same rounded inputs; limits fp32 2e-3, fp16 1e-2, bf16 4e-2 (gradients 2x).",
        "",
        "| check | dtype | result | errors |",
        "|---|---|---|---|",
    ]
    for c in checks:
        errors = ", ".join(f"{k} {v:.1e}" for k, v in c["errors"].items())
        lines.append(f"| {c['check']} | {c['dtype']} | {'pass' if c['ok'] else '**FAIL**'} | {errors} |")
    if bench:
        lengths = sorted({r["L"] for r in bench})
        lines += [
            "",
            "Forward + backward, B=2, H=8, 64 features per head, causal, bf16 (RRA fp32); "
            "wall-clock median ms (x softmax SDPA at the same shape, from the same rounds) / peak MiB "
            "(benchmarks/measure.py):",
            "",
            "| path | " + " | ".join(f"L={n}" for n in lengths) + " |",
            "|---|" + "---:|" * len(lengths),
        ]
        for path in dict.fromkeys(r["path"] for r in bench):
            cells = []
            for n in lengths:
                r = next((r for r in bench if r["path"] == path and r["L"] == n), None)
                if r is None:
                    cells.append("-")
                elif r["status"] == "ok":
                    cells.append(f"{r['ms']:.2f} ({r['x_sdpa']:.2f}x) / {r['peak_mib']:.0f}")
                else:
                    cells.append(r["status"].split(" (")[0])
            lines.append(f"| {path} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="correctness on smaller shapes, no benchmark")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--interpret-on-cpu", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    import torch

    global DEVICE, SMOKE
    if args.interpret_on_cpu:  # exercises this script's code paths only; needs TRITON_INTERPRET=1 set before import
        DEVICE, SMOKE = "cpu", True
        args.quick = True
    elif not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device found; nothing to check (the CPU test suite covers the kernels under "
            "TRITON_INTERPRET=1). Run this script on a machine with an NVIDIA GPU."
        )
        return 0
    import triton

    torch.backends.cuda.matmul.allow_tf32 = False
    started = time.perf_counter()
    dtypes = [torch.float32, torch.float16] if SMOKE else [torch.float32, torch.float16, torch.bfloat16]
    checks: list[dict[str, Any]] = []
    bench: list[dict[str, Any]] = []

    def write_partial(stage: str) -> str:
        """The table so far, rewritten after every stage: a session cut short still leaves its results."""
        meta = {
            "command": " ".join(["python benchmarks/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "CPU (TRITON_INTERPRET=1 smoke test)",
            "torch": torch.__version__,
            "triton": triton.__version__,
            "minutes": (time.perf_counter() - started) / 60,
            "stage": stage,
        }
        text = report(checks, bench, meta)
        if not SMOKE:
            args.output.mkdir(parents=True, exist_ok=True)
            (args.output / "gpu_check.md").write_text(text)
        return text

    for name, run in (
        ("pct", lambda: check_pct(checks, dtypes, args.quick)),
        ("gpa", lambda: check_gpa(checks, dtypes, args.quick)),
        ("rra", lambda: check_rra(checks, args.quick)),
        ("zpx", lambda: check_zpx(checks, dtypes)),
        ("models", lambda: check_models(checks)),
    ):
        try:
            run()
        except Exception as error:  # a crashing kernel is a failed check, the rest still run
            checks.append({"check": f"{name} (crashed)", "dtype": "-", "ok": False, "errors": {}})
            print(f"FAIL {name} crashed: {type(error).__name__}: {error}\n{traceback.format_exc(limit=4)}", flush=True)
        write_partial(f"after the {name} checks")
    if not args.quick:
        benchmark(args.lengths, bench, lambda: write_partial("benchmark in progress"))
    text = write_partial("complete")
    print(text)
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
