"""`executor.fit`: the largest size of a model that trains in a memory, proven by the solver and
run. `search` drives it, `graphs` captures the graph at any size, `memory` counts what exists
before a step, `baselines` runs eager and per-block checkpointing.
"""
