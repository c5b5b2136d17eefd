"""Python engines, one folder per family; the contract is engines/base.py. Nothing
here imports an engine: the manifest (planning/manifest.py) names them as strings."""
