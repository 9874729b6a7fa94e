"""Benchmarks (not timed tests): ``python -m idattn.bench {op,theory,model}``. See docs/kernels.md."""
