"""One flat engine-id space (spec: Backend contract). An id is forever: an autotune
result is (engine_id, knobs), so an id is never reused.

  [0, 10_000)        the cuDNN backend's own engines (its global indices)
  [10_000, 20_000)   the backend's C++ open-source engines
  [20_000, ...)      python engines: FAMILY_BLOCK ids per family, slot = offset
"""

BACKEND_BASE = 0
OSS_BASE = 10_000
PYTHON_BASE = 20_000
FAMILY_BLOCK = 100

# The delegating entry: "let the backend pick among its OSS candidates", which it
# never exposes as plans. Names that one thing only; it carries no mode.
BACKEND_HEURISTIC_ENGINE_ID = OSS_BASE + 9_999


def is_backend_id(engine_id):
    return BACKEND_BASE <= engine_id < PYTHON_BASE


def python_engine_id(family_index, slot):
    if not 0 <= slot < FAMILY_BLOCK:
        raise ValueError(f"slot {slot} is outside a family block of {FAMILY_BLOCK}")
    return PYTHON_BASE + family_index * FAMILY_BLOCK + slot


def decode_python_id(engine_id):
    """(family_index, slot) of a python engine id."""
    if engine_id < PYTHON_BASE:
        raise ValueError(f"engine id {engine_id} is not a python engine id (>= {PYTHON_BASE})")
    return divmod(engine_id - PYTHON_BASE, FAMILY_BLOCK)
