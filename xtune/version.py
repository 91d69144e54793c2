"""xtune's version: the one place it is written (pyproject.toml reads it; logs and model files record it)."""

__version__ = "0.1.0"
