"""The linear_attention family's engines (named by the manifest, imported at planning)."""
