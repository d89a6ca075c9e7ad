"""`python -m benchmarks.evidence ...`: the suite's command line (`suite.main`)."""

from benchmarks.evidence.suite import main

main()
