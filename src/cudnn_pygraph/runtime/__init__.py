"""Execution: the variant pack (native), handles and streams, running a plan."""
