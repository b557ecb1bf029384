"""Shared implementation helpers by op family; converters are thin calls into these."""
