"""Remote models: a DGEMMA_MODEL whose runs happen on a server (this pack's, a diffusion_frame shim, vLLM)."""
