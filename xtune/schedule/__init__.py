"""Schedules: config spaces (mixed-radix knobs) and the loop-nest IR that templates build."""
