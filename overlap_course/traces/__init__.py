"""Traces: recorded quiet-machine runs, and real PyTorch-profiler (Kineto) traces in and out."""
