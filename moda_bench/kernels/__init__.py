"""Operators: each op a folder with its reference, kernels and launch code (moda/)."""
