"""Structured-concurrency helpers every layer shares: fan-out in item order, cooperative time
slices, async resources.
"""
