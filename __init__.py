"""ComfyUI-DiffusionGemma: run DiffusionGemma in ComfyUI and watch it denoise."""

# ComfyUI imports this folder as a package. pytest also imports this file, as the folder's package setup,
# and in a clone whose folder name is no Python name (ComfyUI-DiffusionGemma) it has no parent package.
if __package__:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    __all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]

WEB_DIRECTORY = "./web"
