"""zpx-train's data preparation against transformers' `run_clm.py` recipe on generated jsonl corpora (issue 35).

Corpora of 50 MB, 200 MB and 1 GB are generated into a scratch folder (default /tmp/zpx_bench_data, deleted at the
end): documents of 4-40 paragraphs of CPython's `pydoc_data.topics`, drawn at random (seed 0), one json line
each. Every measurement runs in its own subprocess with an empty datasets cache (`HF_DATASETS_CACHE`), so it
includes reading the jsonl into Arrow; its peak RSS is the subprocess's own `ru_maxrss` and its children's.

- `zpx`: `build_datasets` (tokenize with `datasets.map`, cut into blocks of 512 tokens, uncapped:
  `max_train_blocks: null`, `tasks: []`), the byte tokenizer, `num_proc` 1.
- `zpx (cached)`: the same again on the cache `zpx` left: the reuse of the tokenized files.
- `run_clm`: the recipe of transformers' examples/pytorch/language-modeling/run_clm.py on the same corpus and
  tokenizer: `load_dataset("json")`, `map(tokenize_function, batched=True)`, `map(group_texts, batched=True)`
  (blocks of 512, `labels` a copy), one process. Its Arrow files (input_ids int32 and attention_mask int8:
  datasets' optimized types for those names; then the grouped columns, labels int64: 18 bytes per token; and the
  jsonl as Arrow) take about 19x the corpus with the byte tokenizer: the run refuses up front when the scratch
  folder's disk has less free than `RECIPE_DISK_PER_BYTE` x the corpus (+ `DISK_MARGIN`), and checks again before
  each recipe run. Its disk use is recorded (`disk_mb`), then deleted.
- `zpx streaming`: `build_datasets` with `data.streaming: true`, then the first training step of a tiny ZPX
  model (batch 8 x 512) through `GeometricTrainer`'s DataLoader: the time to it, then 50 more steps of data
  (peak RSS over all of it).

Usage:  nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/bench_data.py [--sizes-mb 50 200 1000]
            [--runs zpx run_clm stream] [--append] [--scratch DIR]    (--quick: a 1 MB smoke run, nothing written)
Writes benchmarks/results/bench_data.{md,csv,json} after every measurement; `--append` adds its rows to those
already there. The scratch folder is deleted at the end, on an error, Ctrl-C or SIGTERM too.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from itertools import chain
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SEQ_LEN = 512
RECIPE_DISK_PER_BYTE = 20  # run_clm's disk per corpus byte: 18 B per token (int32 + int8, int32 + int8 + int64)
DISK_MARGIN = 2e9  # bytes left free beside it (the corpus itself, zpx's streaming cache, other users of the disk)


def generate_corpus(path: Path, size_mb: float, seed: int = 0) -> int:
    """A jsonl corpus of about `size_mb` MB: documents of 4-40 random pydoc paragraphs; returns its bytes."""
    from pydoc_data.topics import topics

    paragraphs = [p.strip() for name in sorted(topics) for p in topics[name].split("\n\n") if p.strip()]
    rng, target, written = random.Random(seed), int(size_mb * 1e6), 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            line = json.dumps({"text": "\n\n".join(rng.choices(paragraphs, k=rng.randint(4, 40)))}) + "\n"
            f.write(line)
            written += len(line.encode())
    return written


def peak_rss_mb() -> float:
    """Peak RSS of this process and of its waited-for children (datasets' map workers), MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


class AnonymousPeak:
    """Peak `RssAnon` of this process (/proc/self/status, sampled every 20 ms by a thread): the memory it owns,
    without the pages of memory-mapped Arrow files that `ru_maxrss` also counts (clean file pages the kernel
    reclaims at will; they grow with the files a pass reads)."""

    def __init__(self) -> None:
        import threading

        self.peak_kb = 0
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            time.sleep(0.02)


def cpu_seconds() -> float:
    """User + system CPU time of this process and its waited-for children: unlike wall time, about the same
    whatever else the shared machine runs."""
    return sum(getattr(resource.getrusage(who), field) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for field in ("ru_utime", "ru_stime"))  # fmt: skip


def free_bytes(folder: Path) -> int:
    """Free bytes on the disk that holds `folder` (or its nearest existing parent)."""
    folder = folder.resolve()
    while not folder.exists():
        folder = folder.parent
    return shutil.disk_usage(folder).free


def recipe_disk_shortfall(folder: Path, corpus_bytes: float) -> str | None:
    """Why the recipe cannot run on a corpus of `corpus_bytes` in `folder` (its disk too full), else None."""
    need, free = RECIPE_DISK_PER_BYTE * corpus_bytes + DISK_MARGIN, free_bytes(folder)
    if free >= need:
        return None
    return (
        f"run_clm on a {corpus_bytes / 1e6:g} MB corpus needs about {need / 1e9:.1f} GB free in {folder} (its Arrow "
        f"files: {RECIPE_DISK_PER_BYTE}x the corpus, + {DISK_MARGIN / 1e9:g} GB), {free / 1e9:.1f} GB are: "
        "point --scratch at a larger disk, or leave run_clm out of --runs or that size out of --sizes-mb."
    )


def folder_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def child_zpx(corpus: str, cache: str) -> dict:
    from zpx_hf_train.data import DataArguments, build_datasets

    data = DataArguments(text_source=corpus, seq_len=SEQ_LEN, tasks=[], max_train_blocks=None, cache_dir=cache)
    started, cpu = time.perf_counter(), cpu_seconds()
    built = build_datasets(data)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    first = built["train"][0]["input_ids"]
    blocks = len(built["train"])
    return {"seconds": seconds, "cpu_s": cpu, "blocks": blocks, "tokens": blocks * SEQ_LEN, "ok": len(first)}


def child_recipe(corpus: str, cache: str) -> dict:
    """run_clm.py's data preparation, as written there (tokenize_function, group_texts), one process."""
    from datasets import load_dataset

    from zpx_hf.tokenization_bytes import build_byte_tokenizer

    tokenizer = build_byte_tokenizer(model_max_length=SEQ_LEN)
    started, cpu = time.perf_counter(), cpu_seconds()
    raw = load_dataset("json", data_files={"train": corpus})

    def tokenize_function(examples):
        return tokenizer(examples["text"])

    tokenized = raw.map(tokenize_function, batched=True, remove_columns=["text"], desc="Running tokenizer on dataset")
    block_size = SEQ_LEN

    def group_texts(examples):
        concatenated_examples = {k: list(chain(*examples[k])) for k in examples}
        total_length = len(concatenated_examples[list(examples.keys())[0]])
        total_length = (total_length // block_size) * block_size
        result = {
            k: [t[i : i + block_size] for i in range(0, total_length, block_size)]
            for k, t in concatenated_examples.items()
        }
        result["labels"] = result["input_ids"].copy()
        return result

    grouped = tokenized.map(group_texts, batched=True, desc=f"Grouping texts in chunks of {block_size}")
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    blocks = len(grouped["train"])
    return {"seconds": seconds, "cpu_s": cpu, "blocks": blocks, "tokens": blocks * SEQ_LEN, "ok": 1}


def child_stream(corpus: str, cache: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    import zpx_hf
    from zpx_hf.tokenization_bytes import build_byte_tokenizer
    from zpx_hf_train.data import DataArguments, build_datasets
    from zpx_hf_train.trainer import build_trainer

    started, cpu = time.perf_counter(), cpu_seconds()
    data = DataArguments(text_source=corpus, seq_len=SEQ_LEN, tasks=[], streaming=True, cache_dir=cache)
    built = build_datasets(data)
    config = zpx_hf.FAMILIES["zpx"][0](
        vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=SEQ_LEN, phase_channels=4,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    args = TrainingArguments(output_dir=os.path.join(cache, "run"), per_device_train_batch_size=8, max_steps=51,
                             report_to=[], use_cpu=True)  # fmt: skip
    trainer = build_trainer(model, build_byte_tokenizer(SEQ_LEN), args, built["train"], None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = iter(trainer.get_train_dataloader())
    first_step = first_cpu = None
    for step in range(51):
        batch = next(batches)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == 0:
            first_step, first_cpu = time.perf_counter() - started, cpu_seconds() - cpu
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "first_step_s": first_step, "first_step_cpu_s": first_cpu, "blocks": 51 * 8, "ok": 1}


CHILDREN = {"zpx": child_zpx, "run_clm": child_recipe, "stream": child_stream}


def run_child(kind: str, corpus: Path, cache: Path) -> dict:
    """One measurement in a fresh subprocess (killed if this process stops); its JSON line, plus `peak_rss_mb`."""
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, __file__, "--child", kind, str(corpus), str(cache)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{kind} on {corpus.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--scratch", default="/tmp/zpx_bench_data")
    parser.add_argument("--runs", nargs="+", default=["zpx", "run_clm", "stream"], choices=["zpx", "run_clm", "stream"])
    parser.add_argument("--append", action="store_true", help="add to the rows of benchmarks/results/bench_data.json")
    parser.add_argument("--quick", action="store_true", help="smoke run: a 1 MB corpus, prints only")
    parser.add_argument("--child", nargs=3, metavar=("KIND", "CORPUS", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, corpus, cache = args.child
        anonymous = AnonymousPeak()
        result = CHILDREN[kind](corpus, cache)
        result["peak_rss_mb"] = peak_rss_mb()
        result["peak_anon_mb"] = anonymous.peak_kb / 1024
        print(json.dumps(result), flush=True)
        return
    if args.quick:
        args.sizes_mb, args.append = [1], False
    scratch = Path(args.scratch)
    if "run_clm" in args.runs:  # fail before any measurement, not an hour in
        for size in args.sizes_mb:
            if shortfall := recipe_disk_shortfall(scratch, size * 1e6):
                parser.error(shortfall)
    niceness, threads = os.nice(0), os.environ.get("OMP_NUM_THREADS")
    command = f"nice -n {niceness} " + (f"env OMP_NUM_THREADS={threads} " if threads else "")
    command += "python benchmarks/bench_data.py " + " ".join(sys.argv[1:])
    rows, commands = [], [command]
    if args.append and (RESULTS / "bench_data.json").is_file():
        previous = json.loads((RESULTS / "bench_data.json").read_text())
        rows, commands = previous["rows"], [*previous["commands"], command]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` deletes the scratch folder
    try:
        for size in args.sizes_mb:
            scratch.mkdir(parents=True, exist_ok=True)
            corpus = scratch / f"corpus_{size:g}mb.jsonl"
            corpus_bytes = generate_corpus(corpus, size)
            runs = [("zpx", "zpx", "a"), ("zpx (cached)", "zpx", "a"), ("run_clm", "run_clm", "r")]
            runs = [run for run in [*runs, ("zpx streaming", "stream", "s")] if run[1] in args.runs]
            for name, kind, cache in runs:
                if kind == "run_clm":
                    shutil.rmtree(scratch / "cache_a", ignore_errors=True)  # zpx's files: room for the recipe's
                    if shortfall := recipe_disk_shortfall(scratch, corpus_bytes):
                        raise RuntimeError(shortfall)
                result = run_child(kind, corpus, scratch / f"cache_{cache}")
                row = {"corpus_mb": round(corpus_bytes / 1e6, 1), "run": name, **result}
                if kind != "stream":  # its time holds 51 training steps, never the whole corpus
                    row["corpus_mb_per_s"] = round(corpus_bytes / 1e6 / result["seconds"], 2)
                    if "cpu_s" in result:
                        row["tokens_per_cpu_s"] = round(result["tokens"] / result["cpu_s"])
                if kind == "run_clm":
                    row["disk_mb"] = round(folder_mb(scratch / "cache_r"))
                    shutil.rmtree(scratch / "cache_r", ignore_errors=True)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if not args.quick:
                    write_results(rows, commands)
            shutil.rmtree(scratch, ignore_errors=True)  # each size's corpus and caches, before the next
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_results(rows: list[dict], commands: list[str]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_data.json").write_text(json.dumps({"commands": commands, "rows": rows}, indent=1) + "\n")
    keys = ["corpus_mb", "run", "seconds", "cpu_s", "tokens_per_cpu_s", "peak_rss_mb", "peak_anon_mb", "blocks"]
    keys += ["first_step_s", "first_step_cpu_s", "disk_mb"]
    with open(RESULTS / "bench_data.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        "# Data preparation: zpx-train against the run_clm.py recipe",
        "",
        " then ".join(f"`{command}`" for command in commands) + f" on {platform.machine()}, {os.cpu_count()} "
        f"cores shared with other work (wall times vary with that load; CPU seconds much less); byte tokenizer, "
        f"blocks of {SEQ_LEN} tokens, one process per measurement with an empty datasets cache (so reading the "
        "jsonl into Arrow is included), `num_proc` 1. Peak RSS: the process's and its children's `ru_maxrss`, which "
        "counts the pages of the memory-mapped Arrow files a pass has read (clean file pages, reclaimed under memory "
        "pressure); peak anonymous RSS: the memory the process owns (`RssAnon`, sampled every 20 ms). "
        "Throughput: tokens in training blocks per CPU second (zpx holds 10% of the documents out, the recipe "
        "none). Streaming: the time to the first training step of a tiny model (batch 8 x 512), peak RSS over 51 "
        "steps. The table shows the last measurement of each corpus and run; bench_data.json holds every one.",
        "",
        "| corpus | run | wall (s) | CPU (s) | tokens / CPU s | peak RSS (MB) | peak anonymous RSS (MB) | blocks | "
        "first step: wall (CPU) s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    latest = {(row["corpus_mb"], row["run"]): row for row in rows}  # the last measurement of each
    for row in sorted(latest.values(), key=lambda r: (r["corpus_mb"], r["run"])):
        cpu = f"{row['cpu_s']:.1f}" if row.get("cpu_s") is not None else ""
        anonymous = f"{row['peak_anon_mb']:.0f}" if row.get("peak_anon_mb") is not None else ""
        first = f"{row['first_step_s']:.1f}" if row.get("first_step_s") is not None else ""
        if row.get("first_step_cpu_s") is not None:
            first += f" ({row['first_step_cpu_s']:.1f})"
        lines.append(
            f"| {row['corpus_mb']:g} MB | {row['run']} | {row['seconds']:.1f} | {cpu} | "
            f"{row.get('tokens_per_cpu_s', '')} | {row['peak_rss_mb']:.0f} | {anonymous} | {row['blocks']} | {first} |"
        )
    comparisons = []
    for size in sorted({row["corpus_mb"] for row in rows}):
        zpx, recipe = (latest.get((size, name)) if latest.get((size, name), {}).get("cpu_s") else None
                       for name in ("zpx", "run_clm"))  # fmt: skip
        parts = []
        if zpx and recipe:
            ratio = zpx["tokens_per_cpu_s"] / recipe["tokens_per_cpu_s"]
            parts.append(
                f"zpx-train's throughput is {ratio:.2f}x the recipe's (tokens per CPU second; target >= "
                f"{1 / 1.2:.2f}x: {'met' if ratio >= 1 / 1.2 else 'NOT met'})"
            )
        if recipe and recipe.get("disk_mb") is not None:
            parts.append(f"the recipe's Arrow files took {recipe['disk_mb']} MB of disk")
        if parts:
            comparisons.append(f"- {size:g} MB: " + "; ".join(parts) + ".")
    if comparisons:
        lines += ["", "Against the recipe:", *comparisons]
    lines.append("\nTargets (issue 35): peak RSS <= 2 GB, streaming's first step < 30 s, throughput >= recipe / 1.2:")
    for (size, name), row in sorted(latest.items()):
        if name in ("zpx", "zpx streaming"):
            verdict = "met" if row["peak_rss_mb"] <= 2048 else "NOT met by ru_maxrss"
            anonymous = f", anonymous {row['peak_anon_mb']:.0f} MB" if row.get("peak_anon_mb") is not None else ""
            first = f", first step {row['first_step_s']:.1f} s" if row.get("first_step_s") is not None else ""
            lines.append(f"- {size:g} MB, {name}: peak RSS {row['peak_rss_mb']:.0f} MB ({verdict}){anonymous}{first}")
    (RESULTS / "bench_data.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
