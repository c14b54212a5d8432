"""Getting a checkpoint into memory: checks before reading, where it goes, quantization, the patches loading needs."""
