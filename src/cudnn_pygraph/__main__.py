"""`python -m cudnn_pygraph ...` is the `cudnn-pygraph` command (cli.py)."""

import sys

from .cli import main

sys.exit(main())
