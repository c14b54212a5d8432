"""What a run is read as: the captured trace, its pictures, logs, files and wire forms, and structured reads."""
