"""Measurement, shared by capture and both runtimes: `measure` and `calibrate` time and size
each op, `transient` counts its bytes, `peak` measures a call's peak memory,
`device` states which device is measured, `fast_ops` holds the faster CPU implementations
both capture and the executor run.
"""
