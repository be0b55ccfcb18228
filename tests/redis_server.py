"""Pytest fixtures (being written)."""
