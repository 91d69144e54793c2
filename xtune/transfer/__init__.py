"""Transfer learning: pretrained cost models from tuning logs, their files and the shipped ones."""
