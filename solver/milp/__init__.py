"""The 0/1 models and their engines: `model` (a solver-neutral linear model), `formulation`
(the stage model and the moment relaxation), `plans`, `cover` (the read-gap cover), `cpsat`,
`lp` and `highs_mip` (HiGHS), `units` (integer costs, safe bounds)."""
