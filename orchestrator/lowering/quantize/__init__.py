"""Quantization: the scheme registry (schemes.py, torch-free), the flows, calibration, and what a program quantized."""
