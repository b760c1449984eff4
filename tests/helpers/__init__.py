"""Shared test helpers, imported as ``from helpers.<module> import ...`` (``pythonpath = ["tests"]`` in pyproject.toml).

Plain functions and constants only: fixtures and hooks live in the conftest.py files.
"""
