"""The gemm family's engines (named by the manifest, imported at planning)."""
