"""The benchmarks: scripts run as ``python bench/NAME.py`` (see the Makefile and
docs/performance.md). A package so that the tests of a benchmark's parts import it by name
(``from bench import bench_pack``); nothing here imports the tests."""
