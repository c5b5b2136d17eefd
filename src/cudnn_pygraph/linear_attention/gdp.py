"""`cudnn_pygraph.linear_attention.gdp` is cudnn_pygraph/ops/linear_attention/gdp.py: this
name binds that module itself, so every name of it (and a patch of one) is the same."""

import sys

from ..ops.linear_attention import gdp

sys.modules[__name__] = gdp
