"""Experiments that sweep a configuration space and compare what they measure."""
