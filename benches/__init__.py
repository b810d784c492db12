"""mimi_py's benchmarks: `python -m benches` runs the suites (benches/suites/) and writes the
results file of this machine and the report (benches/README.md). Not part of the package."""
