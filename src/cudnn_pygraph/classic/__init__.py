"""The rest of the classic top-level surface (NVIDIA's `import cudnn`), one idea per module:

  backend_calls   the compiled frontend module for the calls that only it answers, and the
                  classic error when it cannot run here
  versions        backend_version(), backend_version_string(), get_last_error_string(),
                  sdpa_capabilities()
  direct_ops      the backend's direct (non-graph) kernels: causal_conv1d_*, gnn_*, ...
  kernel_cache    create_kernel_cache()
  decorators      graph(), jit(), graph_cache()
  context         Graph: build inside a `with` block, validated and built at its exit
  types           GraphContext, NodeType, DeviceInfo
  datatypes       torch dtype <-> data_type

`cudnn_pygraph/__init__.py` exports these lazily; nothing here is imported until a name
is asked for, and nothing here imports a framework or the backend at import time.
"""
