"""The project's benchmarks: timing and memory scripts (`bench_*.py`, run as scripts) and the evidence suite
(`benchmarks.evidence`, run as `python -m benchmarks.evidence` from the repository root)."""
