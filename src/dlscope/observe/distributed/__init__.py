"""Distributed runs, observed per rank: per-rank Kineto traces in, tables out (analysis.py)."""
