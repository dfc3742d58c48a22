"""Tracing a training step into one joint forward+backward fx graph: `trace` drives it,
`autograd_functions`, `dropout`, `lifted` and `zero_tangents` handle what the tracer does not
see on its own, `fx_nodes` reads the nodes back.
"""
