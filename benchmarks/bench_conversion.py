"""Does conversion pay? A pretrained Llama continued as itself, converted to ZPX and continued, and ZPX from scratch.

    nice -n 19 env OMP_NUM_THREADS=1 python -m benchmarks.bench_conversion [--seeds 0 1 2]  # the table; resumable
    python -m benchmarks.bench_conversion --tiny --results /tmp/conv  # a seconds-long functional run
    python -m benchmarks.bench_conversion --steps 400 --lr 3e-3       # another continuation, same pretrained Llamas
    python -m benchmarks.bench_conversion --report                    # re-render the markdown from the rows

Per seed: a `LlamaForCausalLM` (transformers' own class, byte tokenizer) is pretrained on the embedded CPython
pydoc corpus for `Settings.pretrain_steps` steps with the package's `Trainer` (`zpx_hf_train.trainer.build_trainer`),
saved, and converted with `zpx_hf.convert_llama_to_zpx` (`zpx-convert`). Then three arms continue for
`Settings.steps` steps on the same rows in the same order (equal steps and tokens: text blocks plus the recall
tasks mqar, passkey and selective_copy, built by `zpx_hf_train.data.build_datasets` as `zpx-train` builds them):
- `converted`: the converted ZPX (its per-head lambdas start at 0 and are trained; `model.init_from`);
- `llama`: the pretrained Llama itself;
- `scratch`: a new ZPX of the same widths with the package's defaults (SRPE, fixed lambdas 1), no pretraining.
Each arm is evaluated by `zpx_hf_train.evaluation.evaluate_model` at step 0 and after the steps: held-out bits per
byte (held-out pydoc documents) and answer-token accuracy / exact match of each recall task.

Rows go to `<results>/bench_conversion.jsonl` as each (seed, arm) finishes; a rerun skips the rows already there
with the same settings, and reuses a seed's saved pretrained Llama (under `--work`, default runs/bench_conversion).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.evidence.rows import RESULTS, append_row, machine, provenance, read_rows
from benchmarks.evidence.stats import ALPHA, t_two_sided_p

ROOT = RESULTS.parents[1]
ARMS = ("converted", "llama", "scratch")
TASKS = ("mqar", "passkey", "selective_copy")
ARM_NAMES = {
    "converted": "Llama converted to ZPX, continued",
    "llama": "Llama continued",
    "scratch": "ZPX from scratch",
}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a row depends on (its fingerprint): sizes, data, steps, learning rates."""

    hidden: int = 64
    intermediate: int = 176
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    phase_channels: int = 8  # zpx-convert's default C
    seq_len: int = 128
    batch: int = 16
    pretrain_steps: int = 400
    steps: int = 200
    pretrain_lr: float = 3e-3
    lr: float = 1e-3
    train_examples_per_task: int = 400
    eval_blocks: int = 48
    eval_examples_per_task: int = 64

    def fingerprint(self, fields: tuple[str, ...] | None = None) -> str:
        values = {key: value for key, value in dataclasses.asdict(self).items() if fields is None or key in fields}
        return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]

    def pretraining(self) -> str:
        """The fingerprint of what the pretrained and converted Llama depend on: settings that differ only in the
        continuation share them."""
        return self.fingerprint(PRETRAINING_FIELDS)


PRETRAINING_FIELDS = ("hidden", "intermediate", "layers", "heads", "kv_heads", "phase_channels", "seq_len", "batch")
PRETRAINING_FIELDS += ("pretrain_steps", "pretrain_lr")


TINY = Settings(
    hidden=32,
    intermediate=64,
    pretrain_steps=4,
    steps=3,
    batch=4,
    train_examples_per_task=8,
    eval_blocks=4,
    eval_examples_per_task=4,
)


def data_arguments(settings: Settings, tasks: tuple[str, ...]) -> Any:
    """The `data:` section of the runs: pydoc text (and the recall tasks), as zpx-train reads it."""
    from zpx_hf_train.data import DataArguments, validate_data_args

    data = DataArguments(
        text_source="pydoc",
        seq_len=settings.seq_len,
        max_eval_blocks=settings.eval_blocks,
        tasks=list(tasks),
        train_examples_per_task=settings.train_examples_per_task,
        eval_examples_per_task=settings.eval_examples_per_task,
        mqar_num_pairs=4,
        selective_copy_num_tokens=4,
        selective_copy_num_positions=16,
    )
    validate_data_args("bench_conversion", data)
    return data


def training_arguments(folder: Path, steps: int, lr: float, seed: int, batch: int) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(folder),
        max_steps=steps,
        per_device_train_batch_size=batch,
        learning_rate=lr,
        lr_scheduler_type="linear",
        warmup_steps=max(1, steps // 20),
        weight_decay=0.01,
        logging_steps=max(1, steps // 10),
        eval_strategy="no",
        save_strategy="no",
        seed=seed,
        data_seed=seed,  # every arm of a seed sees the same rows in the same order
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        use_cpu=True,
    )


def train(model: Any, train_set: Any, folder: Path, steps: int, lr: float, seed: int, batch: int) -> list[float]:
    """`steps` optimizer steps through the package's Trainer; the logged training losses."""
    from zpx_hf.tokenization_bytes import build_byte_tokenizer
    from zpx_hf_train.trainer import build_trainer

    trainer = build_trainer(
        model, build_byte_tokenizer(), training_arguments(folder, steps, lr, seed, batch), train_set, None
    )
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def llama_config(settings: Settings) -> Any:
    from transformers import LlamaConfig

    from zpx_hf.tokenization_bytes import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

    return LlamaConfig(
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        vocab_size=VOCAB_SIZE,
        hidden_size=settings.hidden,
        intermediate_size=settings.intermediate,
        num_hidden_layers=settings.layers,
        num_attention_heads=settings.heads,
        num_key_value_heads=settings.kv_heads,
        max_position_embeddings=settings.seq_len,
        rms_norm_eps=1e-5,
    )


def pretrained_llama(settings: Settings, seed: int, work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """The seed's pretrained Llama and its conversion (made once, then reused): (llama, zpx, pretraining facts)."""
    import torch
    from transformers import LlamaForCausalLM, set_seed

    from zpx_hf import convert_llama_to_zpx
    from zpx_hf.tokenization_bytes import build_byte_tokenizer
    from zpx_hf_train.data import build_datasets

    folder = work / settings.pretraining() / f"seed{seed}"
    llama, zpx, facts_file = folder / "llama", folder / "zpx", folder / "pretraining.json"
    if not facts_file.is_file():
        set_seed(seed)
        model = LlamaForCausalLM(llama_config(settings))
        datasets = build_datasets(data_arguments(settings, ()))
        started = time.perf_counter()
        losses = train(model, datasets["train"], folder / "trainer", settings.pretrain_steps, settings.pretrain_lr,
                       seed, settings.batch)  # fmt: skip
        model.save_pretrained(llama)
        build_byte_tokenizer(model_max_length=settings.seq_len).save_pretrained(llama)
        convert_llama_to_zpx(llama, zpx, phase_channels=settings.phase_channels, seed=seed, overwrite=True)
        facts = {"pretrain_losses": losses, "pretrain_seconds": round(time.perf_counter() - started, 1)}
        facts_file.write_text(json.dumps(facts))
        del model
    torch.manual_seed(seed)
    return llama, zpx, json.loads(facts_file.read_text())


def arm_model(arm: str, settings: Settings, llama: Path, zpx: Path) -> Any:
    """The model an arm continues: from its checkpoint (`zpx_hf_train.trainer.build_model`, as `model.init_from`
    loads it) or new with the package's ZPX defaults at the Llama's widths."""
    from transformers import LlamaConfig

    from zpx_hf import ZPXConfig
    from zpx_hf_train.trainer import build_model

    if arm == "converted":
        return build_model(ZPXConfig.from_pretrained(zpx), None, str(zpx))
    if arm == "llama":
        return build_model(LlamaConfig.from_pretrained(llama), None, str(llama))
    fields = llama_config(settings).to_dict()
    size = {key: fields[key] for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")}
    size.update({key: fields[key] for key in ("num_attention_heads", "num_key_value_heads", "max_position_embeddings")})
    return build_model(ZPXConfig(**size, rms_norm_eps=1e-5, phase_channels=settings.phase_channels))


def summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """Held-out bits per byte and each task's token accuracy / exact match."""
    out = {"bits_per_byte": metrics["heldout"]["bits_per_byte"]}
    for task, values in metrics["tasks"].items():
        out[f"{task}_token_accuracy"] = values["token_accuracy"]
        out[f"{task}_exact_match"] = values["exact_match"]
    return out


def run_cell(settings: Settings, seed: int, arm: str, work: Path) -> dict[str, Any]:
    """Continue one arm of one seed for `settings.steps` steps; evaluated before and after."""
    import torch
    from transformers import set_seed

    from zpx_hf_train.data import build_datasets
    from zpx_hf_train.evaluation import evaluate_model

    torch.set_num_threads(1)
    llama, zpx, facts = pretrained_llama(settings, seed, work)
    datasets = build_datasets(data_arguments(settings, TASKS))
    set_seed(seed)
    model = arm_model(arm, settings, llama, zpx)
    row: dict[str, Any] = {"seed": seed, "arm": arm, "settings": settings.fingerprint(), **provenance()}
    row["settings_fields"] = dataclasses.asdict(settings)
    row["parameters"] = sum(p.numel() for p in model.parameters())
    started = time.perf_counter()
    row["step0"] = summary(evaluate_model(model, datasets["heldout"], datasets["tasks"], 32))
    losses = train(model, datasets["train"], work / "trainer", settings.steps, settings.lr, seed, settings.batch)
    row["final"] = summary(evaluate_model(model, datasets["heldout"], datasets["tasks"], 32))
    row["train_losses"] = losses
    if arm == "converted":  # where training took the per-head lambdas (they start at 0)
        attention = [layer.self_attn for layer in model.model.layers]
        row["lambdas_end"] = {
            kind: [getattr(a, f"lambda_{kind}_heads").detach().round(decimals=4).tolist() for a in attention]
            for kind in ("angle", "sphere")
        }
    row["pretrain_final_loss"] = facts["pretrain_losses"][-1] if facts["pretrain_losses"] else None
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def mean_sd(values: list[float], digits: int = 3) -> str:
    """`mean ± sd [each seed's value]` (one value: itself)."""
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else ""
    seeds = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f} [{seeds}]"


def render(rows: list[dict[str, Any]]) -> str:
    """One section per settings in the rows (the default first): its table and verdict."""
    groups: dict[str, Settings] = {}
    for row in rows:
        groups.setdefault(row["settings"], Settings(**row["settings_fields"]))
    order = sorted(groups, key=lambda key: (groups[key] != Settings(), groups[key].steps, groups[key].lr))
    return "\n".join(render_settings([r for r in rows if r["settings"] == key], groups[key]) for key in order)


def render_settings(rows: list[dict[str, Any]], settings: Settings) -> str:
    """The markdown table of one settings: per arm, mean ± sd over seeds and each seed's value."""
    commands = sorted({row.get("command", "") for row in rows} - {""})
    by_arm = {arm: sorted((r for r in rows if r["arm"] == arm), key=lambda r: r["seed"]) for arm in ARMS}
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        f"**Continued {settings.steps} steps at lr {settings.lr}** (settings `{settings.fingerprint()}`)",
        "",
        f"Commands: {', '.join(f'`{c}`' for c in commands)} (the rows; `--report` renders the tables; {machine()}; "
        f"one thread each, `nice -n 19`). Settings: {json.dumps(dataclasses.asdict(settings))}; commits of the "
        f"rows: {', '.join(sorted({r['commit'][:10] for r in rows}))}.",
        "",
        f"A `LlamaForCausalLM` ({settings.layers} layers, hidden {settings.hidden}, {settings.heads} heads, "
        f"{settings.kv_heads} key-value heads, byte tokenizer) is pretrained for {settings.pretrain_steps} steps "
        f"(batch {settings.batch} x {settings.seq_len} bytes of pydoc text, lr {settings.pretrain_lr}) per seed; "
        f"then each arm continues {settings.steps} steps on the same rows in the same order (pydoc text and the "
        f"recall tasks, lr {settings.lr}, linear decay). Held-out: bits per byte on {settings.eval_blocks} blocks "
        f"of held-out pydoc documents; recall: answer-token accuracy on {settings.eval_examples_per_task} examples "
        f"per task. Mean ± sd over seeds {seeds}, each seed's value in brackets.",
        "",
        f"| arm | parameters | bits/byte, step 0 | bits/byte, step {settings.steps} | "
        + " | ".join(f"{t}, step {settings.steps}" for t in TASKS)
        + " |",
        "|---|---|---|---|" + "---|" * len(TASKS),
    ]
    for arm in ARMS:
        cells = by_arm[arm]
        if not cells:
            lines.append(f"| {ARM_NAMES[arm]} | not run | | |" + " |" * len(TASKS))
            continue
        start = mean_sd([r["step0"]["bits_per_byte"] for r in cells])
        end = mean_sd([r["final"]["bits_per_byte"] for r in cells])
        tasks = [mean_sd([r["final"][f"{t}_token_accuracy"] for r in cells], 2) for t in TASKS]
        lines.append(f"| {ARM_NAMES[arm]} | {cells[0]['parameters']:,} | {start} | {end} | " + " | ".join(tasks) + " |")
    seconds = {arm: statistics.fmean(r["seconds"] for r in cells) for arm, cells in by_arm.items() if cells}
    lines += [
        "",
        "Wall seconds per cell (continuation and both evaluations; mean over seeds, on a shared machine, so only "
        "indicative): " + ", ".join(f"{ARM_NAMES[arm]} {value:.0f}" for arm, value in seconds.items()) + ".",
        "",
        *verdict(by_arm, settings),
    ]
    return "\n".join(lines) + "\n"


def paired(by_arm: dict[str, list[dict[str, Any]]], arm: str, other: str, key: str) -> list[float]:
    """Per-seed differences arm - other of the final `key` (seeds both arms finished)."""
    theirs = {r["seed"]: r["final"][key] for r in by_arm[other]}
    return [r["final"][key] - theirs[r["seed"]] for r in by_arm[arm] if r["seed"] in theirs]


def verdict(by_arm: dict[str, list[dict[str, Any]]], settings: Settings) -> list[str]:
    """Per-seed differences in held-out bits per byte after the steps, in words."""
    lines = []
    llama = {r["seed"]: r for r in by_arm["llama"]}
    exact = [abs(r["step0"]["bits_per_byte"] - llama[r["seed"]]["step0"]["bits_per_byte"]) for r in
             by_arm["converted"] if r["seed"] in llama]  # fmt: skip
    if exact:
        lines.append(
            f"At step 0 the converted ZPX's held-out bits per byte equal the Llama's (largest difference over seeds "
            f"{max(exact):.1e}): the conversion starts from the source's function."
        )
    lambdas = [abs(v) for r in by_arm["converted"] for kind in ("angle", "sphere") for layer in
               r["lambdas_end"][kind] for v in layer]  # fmt: skip
    if lambdas:
        lines.append(
            f"After {settings.steps} steps the converted model's per-head lambdas (from 0) have |lambda| "
            f"{statistics.fmean(lambdas):.4f} on average (largest {max(lambdas):.4f}, all heads, layers, seeds)."
        )
        lines.append("")
    for other in ("llama", "scratch"):
        diffs = paired(by_arm, "converted", other, "bits_per_byte")
        if len(diffs) < 2:
            continue
        mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
        t = mean / (sd / math.sqrt(len(diffs))) if sd > 0 else math.copysign(math.inf, mean)
        p = t_two_sided_p(t, len(diffs) - 1) if math.isfinite(t) else 0.0
        if p >= ALPHA or mean == 0:
            word = f"no difference these {len(diffs)} seeds resolve (p >= {ALPHA})"
        else:
            word = "the converted model is " + ("lower (better)" if mean < 0 else "higher (worse)")
        theirs = statistics.fmean(r["final"]["bits_per_byte"] for r in by_arm[other])
        lines.append(
            f"- converted minus {ARM_NAMES[other]}, held-out bits per byte after {settings.steps} steps: "
            f"{mean:+.4f} ± {sd:.4f} ({100 * mean / theirs:+.2f}% of its {theirs:.3f}; per seed "
            f"{', '.join(f'{d:+.4f}' for d in diffs)}; paired t = {t:.2f}, p = {p:.3f}): {word}."
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tiny", action="store_true", help="seconds-long sizes: a functional check only")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of bench_conversion.{jsonl,md}")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_conversion", help="pretrained Llamas")
    parser.add_argument("--report", action="store_true", help="only re-render the markdown from the rows")
    parser.add_argument("--steps", type=lambda v: {"steps": int(v)}, help="continuation steps (default 200)")
    parser.add_argument("--lr", type=lambda v: {"lr": float(v)}, help="continuation learning rate (default 1e-3)")
    args = parser.parse_args(argv)
    settings = dataclasses.replace(TINY if args.tiny else Settings(), **(args.steps or {}), **(args.lr or {}))
    args.results.mkdir(parents=True, exist_ok=True)
    jsonl, markdown = args.results / "bench_conversion.jsonl", args.results / "bench_conversion.md"
    command = "OMP_NUM_THREADS=1 python -m benchmarks.bench_conversion" + (" --tiny" if args.tiny else "")
    command += f" --seeds {' '.join(map(str, args.seeds))}" if args.seeds != [0, 1, 2] else ""
    command += f" --steps {settings.steps}" if args.steps else ""
    command += f" --lr {settings.lr}" if args.lr else ""
    if not args.report:
        for seed in args.seeds:
            for arm in ARMS:
                rows = [r for r in read_rows(jsonl) if r["settings"] == settings.fingerprint()]
                if any((r["seed"], r["arm"]) == (seed, arm) for r in rows):  # read again: other seeds may run beside
                    continue
                row = {**run_cell(settings, seed, arm, args.work), "command": command}
                append_row(jsonl, row)
                print(f"seed {seed} {arm}: bits/byte {row['step0']['bits_per_byte']:.4f} -> "
                      f"{row['final']['bits_per_byte']:.4f} ({row['seconds']} s)", flush=True)  # fmt: skip
    markdown.write_text(render(read_rows(jsonl)))
    print(f"wrote {markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
