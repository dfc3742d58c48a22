"""`executor.fit`: the largest size of a model that trains in a memory, proven by the solver and
run. `api` holds `fit` and checks its arguments, `search` drives it on its one deadline,
`step_bytes` gives the step's bytes at any size, `graphs` captures the graph at any size,
`memory` counts what exists before a step, `baselines` runs eager and per-block checkpointing.
"""
