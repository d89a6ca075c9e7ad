"""Training-step time and greedy generation speed of every family, as ratios to a LlamaForCausalLM.

    python benchmarks/bench_step.py                        # full grid (CPU, 1 thread), writes results
    python benchmarks/bench_step.py --quick                # smoke run: tiny sizes, prints only
    python benchmarks/bench_step.py --families pct versor-rra

Models (vocabulary 260, 4 layers, 4 heads; every model through the public `AutoModelForCausalLM.from_config`
with `attn_implementation="sdpa"`, each family's fast path):
  llama          transformers `LlamaForCausalLM`, hidden 256, intermediate 688: the baseline
  zpx            `ZPXConfig`, same sizes as Llama (8 phase channels, SRPE)
  pct            `PCTConfig`, parameter-matched to Llama: real hidden width sqrt(2) x 256 (complex 181 -> 184:
                 Llama's attention parameters), intermediate width chosen so the total matches Llama's
                 (a complex weight is 2 parameters but 4 real multiplies)
  versor-rra     `VersorConfig(mixer="rra")`, hidden 256 (8 multivectors), intermediate 512
  versor-gpa     same with `mixer="gpa"`
  versor-hybrid  same with `mixer="hybrid"`

Training step: forward + backward + AdamW at B=4, L=256 and L=1024 (labels = inputs). Generation: greedy
`generate`, batch 1, a 32-token prompt, exactly 256 new tokens with the KV / recurrent cache; tokens/s =
256 / time. Decode at long context: ms per token of 32 single-token forwards with the cache after a prefill
of 4096 random tokens (the KV cache grows with the context, the Versor RRA state does not). Peak
memory: growth of the peak RSS of a fresh worker holding one model over one training step at the longest L
(model and optimizer state exist before the baseline is read; the first step, no warm-up). Times are
wall-clock seconds (1 torch thread; run it on an idle machine). Measured as every benchmark measures
(benchmarks/measure.py): each measurement in a fresh worker process; inside it the models take turns (the
order reversed every round) so cache and memory contention hit them alike; each number is the median over
the rounds after a warm-up round, and ratios to Llama come from the same rounds.
Writes benchmarks/results/bench_step.md and bench_step.csv (not with --quick).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from measure import clock, interleaved_times, median_ratio, medians, peak_memory, run_worker  # benchmarks/measure.py

RESULTS = Path(__file__).resolve().parent / "results"
FAMILIES = ("zpx", "pct", "versor-rra", "versor-gpa", "versor-hybrid")
FULL = {"hidden": 256, "intermediate": 688, "layers": 4, "heads": 4, "batch": 4, "lengths": [256, 1024],
        "prompt": 32, "new_tokens": 256, "train_rounds": 8, "generate_rounds": 10,
        "contexts": [4096], "decode_tokens": 32, "decode_rounds": 3}  # fmt: skip
QUICK = {"hidden": 64, "intermediate": 172, "layers": 2, "heads": 2, "batch": 2, "lengths": [32],
         "prompt": 8, "new_tokens": 8, "train_rounds": 3, "generate_rounds": 3,
         "contexts": [64], "decode_tokens": 4, "decode_rounds": 2}  # fmt: skip
VOCAB = 260


def llama_config(size: dict) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        max_position_embeddings=4096,
    )


def count_parameters(config: Any) -> int:
    """Parameters of the causal-LM model built from `config` (on the meta device: nothing allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def matched_pct_config(size: dict, target: int) -> Any:
    """PCTConfig with Llama's attention parameters and the total parameter count closest to `target`.

    A complex h x h weight holds 2 h^2 real parameters, so the complex width h = hidden / sqrt(2) (real
    width sqrt(2) hidden, rounded to a multiple of 4 x heads) gives the attention block Llama's 4 hidden^2;
    the intermediate width (a multiple of 4) then closes the gap in the total.
    """
    from zpx_hf import PCTConfig

    common = dict(vocab_size=VOCAB, num_hidden_layers=size["layers"], num_attention_heads=size["heads"])
    common["max_position_embeddings"] = 4096
    step = 4 * size["heads"]
    hidden = round(size["hidden"] * 2**0.5 / step) * step  # real features [re | im]
    intermediate = round(size["intermediate"] * 2**0.5 / 4) * 4
    config = PCTConfig(hidden_size=hidden, intermediate_size=intermediate, **common)
    wider = PCTConfig(hidden_size=hidden, intermediate_size=intermediate + 4, **common)
    per_step = count_parameters(wider) - count_parameters(config)
    intermediate += 4 * round((target - count_parameters(config)) / per_step)  # parameters are linear in it
    return PCTConfig(hidden_size=hidden, intermediate_size=max(4, intermediate), **common)


def family_config(family: str, size: dict, llama_params: int) -> Any:
    from zpx_hf import VersorConfig, ZPXConfig

    common = dict(
        vocab_size=VOCAB,
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        max_position_embeddings=4096,
    )
    if family == "zpx":
        return ZPXConfig(hidden_size=size["hidden"], intermediate_size=size["intermediate"], phase_channels=8, **common)
    if family == "pct":
        return matched_pct_config(size, llama_params)
    if family.startswith("versor-"):
        return VersorConfig(
            hidden_size=size["hidden"], intermediate_size=2 * size["hidden"], mixer=family.split("-")[1], **common
        )
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}.")


def build(name: str, size: dict, llama_params: int) -> Any:
    """The model `name` (llama or a family) through AutoModelForCausalLM.from_config, in train mode."""
    from transformers import AutoModelForCausalLM

    import zpx_hf  # noqa: F401  (registers the families with the Auto classes)

    config = llama_config(size) if name == "llama" else family_config(name, size, llama_params)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def build_all(names: list[str], size: dict) -> tuple[dict, dict]:
    """({name: model}, {name: error}) with the same seed for every model."""
    import torch

    llama_params = count_parameters(llama_config(size))
    models, errors = {}, {}
    for name in names:
        torch.manual_seed(0)
        try:
            models[name] = build(name, size, llama_params)
        except Exception as error:  # any error: one family failing must not end the benchmark
            errors[name] = f"{type(error).__name__}: {error}"[:200]
    return models, errors


def summarise(times: dict, errors: dict, build_errors: dict, models: dict) -> dict:
    """{name: {"seconds" (median), "params", "ratio", "speed_ratio"} or {"error"}}: "ratio" = median over the
    rounds of the model's time / Llama's in the same round, "speed_ratio" of Llama's / the model's (both absent
    when Llama failed)."""
    seconds = medians(times)
    out = {}
    for name in list(models) + list(build_errors):
        if name in build_errors or name in errors:
            out[name] = {"error": build_errors.get(name) or errors[name]}
        else:
            params = sum(p.numel() for p in models[name].parameters())
            out[name] = {"seconds": seconds[name], "params": params}
            if "llama" in models and "llama" not in errors:
                out[name]["ratio"] = median_ratio(times, name, "llama")
                out[name]["speed_ratio"] = median_ratio(times, "llama", name)
    return out


def train_worker(names: list[str], size: dict, length: int) -> dict:
    import torch

    torch.set_num_threads(1)
    models, build_errors = build_all(names, size)
    ids = torch.randint(3, VOCAB, (size["batch"], length), generator=torch.Generator().manual_seed(0))
    steps = {}
    for name, model in models.items():
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, optimizer=optimizer) -> None:
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        steps[name] = step
    times, errors = interleaved_times(steps, size["train_rounds"] - 1)
    return summarise(times, errors, build_errors, models)


def generate_worker(names: list[str], size: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    models, build_errors = build_all(names, size)
    prompt = torch.randint(3, VOCAB, (1, size["prompt"]), generator=torch.Generator().manual_seed(0))
    new = size["new_tokens"]
    runs = {}
    for name, model in models.items():
        model.eval()

        def run(model=model) -> None:
            with torch.no_grad():
                out = model.generate(
                    input_ids=prompt,
                    attention_mask=torch.ones_like(prompt),
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=0,
                )
            if out.shape[1] != prompt.shape[1] + new:
                raise RuntimeError(f"generated {out.shape[1] - prompt.shape[1]} tokens, expected {new}")

        runs[name] = run
    times, errors = interleaved_times(runs, size["generate_rounds"] - 1)
    return summarise(times, errors, build_errors, models)


def decode_worker(names: list[str], size: dict, context: int) -> dict:
    """Seconds per decoded token after a `context`-token prefill (the cache is rebuilt every round)."""
    import torch

    from zpx_hf.modeling_blocks import CACHE_FIELD

    torch.set_num_threads(1)
    models, build_errors = build_all(names, size)
    prompt = torch.randint(3, VOCAB, (1, context), generator=torch.Generator().manual_seed(0))
    runs = {}
    for name, model in models.items():
        model.eval()

        def run(model=model) -> float:
            with torch.no_grad():
                out = model(input_ids=prompt, use_cache=True)
                cache, token = getattr(out, CACHE_FIELD), out.logits[:, -1:].argmax(-1)
                start = clock()  # the prefill above is set-up, not timed
                for _ in range(size["decode_tokens"]):
                    out = model(input_ids=token, past_key_values=cache, use_cache=True)
                    cache, token = getattr(out, CACHE_FIELD), out.logits[:, -1:].argmax(-1)
                return (clock() - start) / size["decode_tokens"]

        runs[name] = run
    times, errors = interleaved_times(runs, size["decode_rounds"] - 1)
    return summarise(times, errors, build_errors, models)


def memory_worker(name: str, size: dict, length: int) -> dict:
    """Peak-RSS growth (bytes) of one training step of one model at batch x `length`."""
    import torch

    torch.set_num_threads(1)
    models, build_errors = build_all([name], size)
    if name in build_errors:
        return {name: {"error": build_errors[name]}}
    model = models[name].train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for parameter in model.parameters():  # optimizer state allocated before the baseline
        optimizer.state[parameter] = {
            "step": torch.tensor(0.0),
            "exp_avg": torch.zeros_like(parameter),
            "exp_avg_sq": torch.zeros_like(parameter),
        }
    ids = torch.randint(3, VOCAB, (size["batch"], length), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()

    return {name: {"peak_bytes": peak_memory(step)}}


def report(results: dict, names: list[str], size: dict, command: str, seconds: float) -> tuple[list[str], list[dict]]:
    """Markdown lines and CSV rows: each measurement with its ratio to Llama from the same worker."""
    header = (
        f"Training step and generation vs `LlamaForCausalLM` (wall clock, 1 thread; `{command}`; "
        f"{seconds / 60:.1f} min wall). "
        f"Vocabulary {VOCAB}, {size['layers']} layers, {size['heads']} heads; Llama/ZPX hidden {size['hidden']}, "
        f"intermediate {size['intermediate']}; PCT parameter-matched to Llama; Versor hidden {size['hidden']}. "
        f"Medians over {size['train_rounds'] - 1} (training) / {size['generate_rounds'] - 1} (generation) "
        "interleaved rounds after a warm-up; ratios to Llama from the same rounds."
    )
    columns = [f"train L={length} ms" for length in size["lengths"]]
    columns += [f"train L={length} / Llama" for length in size["lengths"]]
    columns += ["generate tok/s", "generate / Llama"]
    decodes = [f"decode-{context}" for context in size["contexts"]]
    memory = f"memory-{max(size['lengths'])}"
    columns += [f"decode @{context} ms/token" for context in size["contexts"]]
    columns += [f"decode @{context} / Llama (speed)" for context in size["contexts"]]
    columns += [f"train L={max(size['lengths'])} peak MiB", "peak / Llama"]
    lines = [header, "", "| model | params | " + " | ".join(columns) + " |", "|---|---:|" + "---:|" * len(columns)]
    rows = []
    for name in ["llama", *names]:
        cells, row = [], {"model": name}
        params = "-"
        for kind in [f"train-{length}" for length in size["lengths"]] + ["generate", *decodes, memory]:
            result, base = results.get(kind, {}).get(name, {}), results.get(kind, {}).get("llama", {})
            if "params" in result:
                params = f"{result['params']:,}"
                row["params"] = result["params"]
            key = "peak_bytes" if kind == memory else "seconds"
            if key not in result:
                row[kind] = "error: " + result.get("error", "not run")
                continue
            if kind == memory:  # one fresh worker per model: a ratio of the two peaks
                value = result["peak_bytes"] / 2**20
                ratio = result["peak_bytes"] / base["peak_bytes"] if "peak_bytes" in base else float("nan")
            else:  # ratios from the same rounds (summarise); generation and decode as speed, Llama / model
                value = size["new_tokens"] / result["seconds"] if kind == "generate" else result["seconds"] * 1e3
                ratio = result.get("speed_ratio" if kind == "generate" or kind in decodes else "ratio", float("nan"))
            row[kind], row[kind + " ratio"] = round(value, 2), round(ratio, 3)
        for kind in [f"train-{length}" for length in size["lengths"]]:
            cells.append(_cell(row, kind, "{:,.0f}"))
        for kind in [f"train-{length}" for length in size["lengths"]]:
            cells.append(_cell(row, kind + " ratio", "{:.2f}x"))
        cells += [_cell(row, "generate", "{:,.1f}"), _cell(row, "generate ratio", "{:.2f}x")]
        cells += [_cell(row, kind, "{:,.2f}") for kind in decodes]
        cells += [_cell(row, kind + " ratio", "{:.2f}x") for kind in decodes]
        cells += [_cell(row, memory, "{:,.0f}"), _cell(row, memory + " ratio", "{:.2f}x")]
        lines.append(f"| {name} | {params} | " + " | ".join(cells) + " |")
        rows.append(row)
    errors = [f"- {name} {kind}: {row[kind]}" for row in rows for kind in row if str(row[kind]).startswith("error")]
    if errors:
        lines += ["", "Failures:", *[line.replace("error: ", "") for line in errors]]
    return lines, rows


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if isinstance(value, (int, float)):
        return fmt.format(value)
    base = key.removesuffix(" ratio")
    return "failed" if str(row.get(base, "")).startswith("error") else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, few rounds, no files written")
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        kind, names, size, *rest = json.loads(args.worker)
        workers = {"train": train_worker, "generate": generate_worker, "decode": decode_worker}
        result = memory_worker(names[0], size, *rest) if kind == "memory" else workers[kind](names, size, *rest)
        print(json.dumps(result))
        return

    size = QUICK if args.quick else FULL
    names = [f for f in FAMILIES if f in args.families]
    command = "python benchmarks/bench_step.py " + " ".join(sys.argv[1:])
    started = clock()
    results: dict[str, dict] = {}
    everyone = ["llama", *names]
    for length in size["lengths"]:
        results[f"train-{length}"] = _worker(["train", everyone, size, length])
        print(f"train L={length}:", json.dumps(results[f"train-{length}"]), flush=True)
    results["generate"] = _worker(["generate", everyone, size])
    print("generate:", json.dumps(results["generate"]), flush=True)
    for context in size["contexts"]:
        results[f"decode-{context}"] = _worker(["decode", everyone, size, context])
        print(f"decode @{context}:", json.dumps(results[f"decode-{context}"]), flush=True)
    memory = f"memory-{max(size['lengths'])}"
    results[memory] = {}
    for name in everyone:  # one fresh worker per model: peak RSS is per process
        results[memory].update(_worker(["memory", [name], size, max(size["lengths"])]))
    print("memory:", json.dumps(results[memory]), flush=True)
    lines, rows = report(results, names, size, command.strip(), clock() - started)
    print("\n".join(lines))
    if args.quick:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_step.md").write_text("\n".join(lines) + "\n")
    fields = ["model", "params"] + [k for kind in results for k in (kind, kind + " ratio")]
    with open(RESULTS / "bench_step.csv", "w", newline="") as f:
        f.write(f"# {command.strip()}\n")
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: row.get(key, "") for key in fields})


def _worker(spec: list) -> dict:
    """A worker's result, or the same error for every model when the worker itself failed."""
    result = run_worker(__file__, spec, timeout=3600)
    if "error" in result and len(result) == 1:
        return {name: {"error": result["error"]} for name in spec[1]}
    return result


if __name__ == "__main__":
    main()
