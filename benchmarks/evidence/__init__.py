"""The evidence suite: attention variants on recall, geometry, text and N-body tasks at matched parameters.

Run from the repository root:

    python -m benchmarks.evidence --size evidence --workers 2             # the evidence suite (issue 21); resumable
    python -m benchmarks.evidence --size evidence --workers 2 --report    # re-render from the saved rows only
    python -m benchmarks.evidence --size evidence_smoke --tasks mqar --variants baseline   # its machinery, ~1 min
    python -m benchmarks.evidence --size full --device cuda --workers 1   # the seeds' scale (16K needle), a GPU
    python -m benchmarks.evidence --size full --device cuda --tasks listops   # LRA ListOps alone, a GPU
    python -m benchmarks.evidence.calibrate --trials ...                  # the baseline's budget calibration
    python -m benchmarks.evidence.nbody_study --study ...                 # the N-body protocol study
    python -m benchmarks.evidence.nbody_geometry                          # N-body, one token per body (issue 37)
    python -m benchmarks.evidence.pct_defaults --task mqar                # the PCT defaults sweep
    python -m benchmarks.evidence.lm_study                                # byte-level LM on the stdlib (issue 37)

Evidence protocol (`--size evidence`, `evidence_smoke`, `full`; `plan`): every variant at every lr of the grid
with seed 0, the best on a validation split (its own data seed) selected (a pick on the grid's edge widens the grid
by the next half-decade lr first), then seeds 1 .. n-1 at that lr; only those are reported and tested (seed 0 only
selects); test numbers at the selected setting with per-example hits in each row; validation curves at step
checkpoints with training FLOPs; verdicts by claim family declared in the plan (Welch with its interval at the
Bonferroni level, exact permutation and Mann-Whitney tests beside it; `stats`); every row records commit, dirty
flag, config hash, lr, seed, protocol and budget fingerprint. Headline cells (MQAR, the needle at 80 tokens tested
at 1-8x, N-body) run first with 5 seeds. Rows of other protocols stay listed as superseded.

The superseded protocols (`--size small`, `medium`: one lr, verdicts by "mean gap beyond both stds") and their
report code were removed with this package: the package and the N-body protocol changed since their runs, so the
code of today no longer rendered their committed results. Those files (results/ablation_small.*,
ablation_medium.*, calibration_medium.*) are frozen, as rendered by the code of their commits
(docs/evidence_superseded.md); their rows stay in the jsonl files and the evidence report lists medium's rows.

Variants (`models.VARIANTS`, the package's families through the Auto classes): the baseline (softmax + RoPE: ZPX
with both lambdas 0 and rotary RoPE, Llama-style), softmax + SRPE, the ZPX kernels (angle, sphere, centre loss,
SRPE), PCT (and its scale options; `pct_tuned` selects over them), and Versor with each mixer.

Tasks (`tasks`, `nbody`): mqar, passkey (keyed needle among distractors, evaluated at multiples of the trained
length), passkey_long (the same needle trained and tested at one long length), spiral (4 classes), nbody (rollout
position MSE and energy drift), listops (LRA ListOps: the value digit of a nested MAX / MIN / MED / SM expression,
10 classes); selective_copy and text (pydoc bytes, held-out perplexity) ran in the medium protocol and are in no
size of this one.

Every finished run is appended to results/ablation_<size>.jsonl at once; a rerun skips the runs already there with
the same protocol and task budget, so an interrupted suite resumes where it stopped. Each run uses one thread
(`--workers` runs in parallel). Tables, verdicts and plots (`report`) are rewritten from the jsonl after every run.

Modules, each importing only those above it: `protocol` (budgets, sizes, data seeds, selection metrics), `rows`
(result jsonl, provenance), `stats`, `training` (the shared loop), `nbody` (the N-body task), `tasks` (token
tasks), `models` (variants, parameter matching), `runs` (one job), `sizes`, `plan`, `audit` (convergence, body
parameters, compute, configurations, lr ranges), `report`, `suite` (the command line), and the tools `calibrate`,
`nbody_study`, `nbody_geometry` (with `nbody_bodies`: body tokens, equivariance errors, zero-shot body counts),
`pct_defaults`, `lm_study`.
"""
