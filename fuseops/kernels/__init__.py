"""Triton kernels and their launchers, each with a plain-torch reference beside it.

This layer knows tensors only: no modules, recipes or fusions.
"""
