"""The 0/1 models and their engines: `model` (a solver-neutral linear model), `formulation`
(the stage model and the moment relaxation), `plans`, `cover` (the read-gap cover), `cpsat`,
`lp` and `highs_mip` (HiGHS), `units` (integer costs, safe bounds); with offload, the exact
model `offload_model` in the units of `offload_times`, solved by `offload`."""
