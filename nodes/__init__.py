"""The ComfyUI nodes: thin classes over the engine in dgemma/."""

NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}
