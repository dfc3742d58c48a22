"""remat's own runtime: the captured joint forward+backward graph run op by op under a solved
schedule (`Rematerialized`, `rematerialize`). `rematerialize` captures, solves and wraps,
`module` wraps the model, `step` runs its step as one autograd Function, `interpreter` is the
reference semantics, `codegen` compiles them into straight-line code, `bindings` and `rng` make
each node's call and random draw those of eager, `checks` compares a call with the captured one.
"""
