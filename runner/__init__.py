"""Run API-format graphs of this pack without ComfyUI (or submit them to a running ComfyUI).

graph.py validates a graph the way ComfyUI's validator does, execute.py calls nodes the way its
executor does, core_nodes.py stands in for the core preview/save nodes and Video Combine,
client.py talks to a server, cli.py is `python -m headless`.
"""
