"""The sdpa family's engines (named by the manifest, imported at planning)."""
