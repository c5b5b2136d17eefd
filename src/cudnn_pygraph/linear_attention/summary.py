"""`cudnn_pygraph.linear_attention.summary` is cudnn_pygraph/ops/linear_attention/summary.py: this
name binds that module itself, so every name of it (and a patch of one) is the same."""

import sys

from ..ops.linear_attention import summary

sys.modules[__name__] = summary
