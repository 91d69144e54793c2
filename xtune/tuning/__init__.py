"""Tuning: measurement, the log, features, cost models, search, tuners and the tuning run."""
