"""The engine as an OpenAI-compatible HTTP server: `python -m serve` from the pack's folder."""
