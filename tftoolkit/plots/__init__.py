"""Figures from tidy frames: each function takes a DataFrame and returns a matplotlib Figure."""
