"""An MCP server over the DiffusionGemma engine, for agents: `python -m mcp_server` (stdio).

Tools: load_model, model_status, generate (per-step progress), encode (context handles), cancel_run.
Needs the optional SDK: pip install 'mcp>=2,<3'.
"""
