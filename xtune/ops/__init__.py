"""Operator families: each operator's workload keys, reference, template and features in one home."""
