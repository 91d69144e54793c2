"""The model level above tuning: a network as tasks, its memory plan, its remaining operators."""
