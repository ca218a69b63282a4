"""Fake boards for tests and benchmarks (like `fabric.testing`): real OpenSSH servers on loopback."""
