"""torch.compile speed-up of a training step, per family beside `LlamaForCausalLM`'s own.

    python benchmarks/bench_compile.py                     # CPU, 1 thread, inductor; writes results
    python benchmarks/bench_compile.py --quick             # smoke run: tiny sizes, prints only
    python benchmarks/bench_compile.py --backend aot_eager --families versor-rra

Models are bench_step.py's (`AutoModelForCausalLM.from_config`, `attn_implementation="sdpa"`; PCT
parameter-matched to Llama, Versor at Llama's hidden width) at the sizes below. For each model one worker
process holds the eager model and `torch.compile(model, backend=...)` (the same parameters) and times the
same training step with both: forward with labels, backward, AdamW step (the optimizer runs eagerly in
both). The first round compiles and is not counted; in every later round all models and both modes take
turns, the order reversed every round, and a ratio is compiled / eager from the same rounds (wall clock,
1 torch thread, medians over the rounds: benchmarks/measure.py). Graph breaks are counted by
`torch._dynamo.explain` on the forward with labels.
Writes benchmarks/results/bench_compile.md and bench_compile.csv (not with --quick).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

from bench_step import FAMILIES, VOCAB, build_all  # benchmarks/bench_step.py
from measure import interleaved_times, median_ratio, medians, run_worker  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"
FULL = {"hidden": 128, "intermediate": 344, "layers": 2, "heads": 4, "batch": 4, "length": 256, "rounds": 7}
QUICK = {"hidden": 64, "intermediate": 172, "layers": 2, "heads": 2, "batch": 2, "length": 32, "rounds": 3}
MODES = ("eager", "compiled")


def compile_worker(names: list[str], size: dict, backend: str) -> dict:
    import torch

    torch.set_num_threads(1)
    models, build_errors = build_all(names, size)
    ids = torch.randint(3, VOCAB, (size["batch"], size["length"]), generator=torch.Generator().manual_seed(0))
    steps, breaks = {}, {}
    for name, model in models.items():
        model.train()
        explanation = torch._dynamo.explain(model)(input_ids=ids, labels=ids, use_cache=False)
        breaks[name] = explanation.graph_break_count
        torch.compiler.reset()  # the public reset (explain has no public twin)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for mode, forward in zip(MODES, (model, torch.compile(model, backend=backend))):

            def step(forward=forward, optimizer=optimizer) -> None:
                forward(input_ids=ids, labels=ids, use_cache=False).loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            steps[f"{name}/{mode}"] = step
    times, errors = interleaved_times(steps, size["rounds"] - 1)  # the warm-up round compiles
    seconds = medians(times)
    out = {}
    for name in list(models) + list(build_errors):
        failed = build_errors.get(name) or errors.get(f"{name}/eager") or errors.get(f"{name}/compiled")
        if failed:
            out[name] = {"error": failed}
            continue
        out[name] = {
            "params": sum(p.numel() for p in models[name].parameters()),
            "graph_breaks": breaks[name],
            "eager_ms": seconds[f"{name}/eager"] * 1e3,
            "compiled_ms": seconds[f"{name}/compiled"] * 1e3,
            "ratio": median_ratio(times, f"{name}/compiled", f"{name}/eager"),
        }
    return out


def report(results: dict, names: list[str], size: dict, backend: str, command: str, seconds: float):
    header = (
        f"torch.compile (backend `{backend}`) vs eager, one training step (forward with labels, backward, AdamW) "
        f"on CPU, 1 thread (`{command}`; {seconds / 60:.1f} min wall). Vocabulary {VOCAB}, {size['layers']} "
        f"layers, {size['heads']} heads, hidden {size['hidden']} (PCT parameter-matched to Llama), batch "
        f"{size['batch']} x {size['length']} tokens. Wall-clock medians over {size['rounds'] - 1} interleaved "
        "rounds after the compiling round; ratio = compiled / eager from the same rounds (below 1: compile "
        "is faster). Graph breaks: `torch._dynamo.explain` on the forward with labels."
    )
    lines = [
        header,
        "",
        "| model | params | graph breaks | eager ms | compiled ms | compiled / eager |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for name in ["llama", *names]:
        result = results.get(name, {"error": "not run"})
        if "error" in result:
            lines.append(f"| {name} | - | - | failed | failed | - |")
            rows.append({"model": name, "error": result["error"]})
            continue
        lines.append(
            f"| {name} | {result['params']:,} | {result['graph_breaks']} | {result['eager_ms']:,.0f} | "
            f"{result['compiled_ms']:,.0f} | {result['ratio']:.2f}x |"
        )
        rows.append({"model": name, **{key: round(value, 3) for key, value in result.items()}})
    failures = [f"- {row['model']}: {row['error']}" for row in rows if "error" in row]
    if failures:
        lines += ["", "Failures:", *failures]
    return lines, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, few rounds, no files written")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        print(json.dumps(compile_worker(*json.loads(args.worker))))
        return

    size = QUICK if args.quick else FULL
    names = [f for f in FAMILIES if f in args.families]
    command = ("python benchmarks/bench_compile.py " + " ".join(sys.argv[1:])).strip()
    started = time.perf_counter()
    results = run_worker(__file__, [["llama", *names], size, args.backend], timeout=7200)
    if "error" in results and len(results) == 1:
        results = {name: {"error": results["error"]} for name in ["llama", *names]}
    lines, rows = report(results, names, size, args.backend, command, time.perf_counter() - started)
    print("\n".join(lines))
    if args.quick:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_compile.md").write_text("\n".join(lines) + "\n")
    fields = ["model", "params", "graph_breaks", "eager_ms", "compiled_ms", "ratio", "error"]
    with open(RESULTS / "bench_compile.csv", "w", newline="") as f:
        f.write(f"# {command}\n")
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: row.get(key, "") for key in fields})


if __name__ == "__main__":
    main()
