"""Figures from numbers: matplotlib drawings, report folders, learning-rate and rate curves, run plots."""
