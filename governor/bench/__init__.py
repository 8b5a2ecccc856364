"""Benchmarks behind `governor bench ...`: each measures the engine beside a peer and writes JSON plus a PNG."""
