"""An MCP server over the DiffusionGemma engine, for agents: `python -m mcp_server` (stdio).

Tools: load_model, model_status, generate (per-step progress, images, schedulers, pins, windows and
resume), encode (context handles), cancel_run, free_handle; each run's log is a resource.
Needs the optional SDK: pip install 'mcp>=2,<3'.
"""
