"""The package's version: the one place it is written (pyproject reads it from here, and
so do the caches that key on it), below every other module so any layer may import it."""

__version__ = "0.1.0"
