"""Triton source generated from layers (never stored in an engine: regenerated when an engine loads)."""
