"""zpx-hf training jobs: train any family from a YAML config, fine-tune with LoRA, run the README's main job.

One module per job: `config` (YAML + `HfArgumentParser`, `ConfigError`), `data` (corpus and synthetic tasks),
`distributed` (what each launch does), `run_folder` (lock, marker, atomic writes, resume choice), `job` (the
steps both training jobs take), `trainer` (model, `Trainer`, callbacks, atomic final save),
`report` (metrics, report, loss curve, model card), `cli` (the shared command line), and the commands
`train` (`zpx-train`), `finetune_lora` (`zpx-finetune-lora`), `main_job` (`zpx-main`) and `inspection`
(`zpx-inspect`). Importing the package imports nothing heavy; each module imports what it needs.
"""
