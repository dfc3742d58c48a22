"""SAC plans: a solved plan run inside `torch.utils.checkpoint` (`checkpoint_plan` in
`planning`, `CheckpointPlan` in `plan`, `sharded` for FSDP2 ranks; `step` the step's loss
closure, time limit and state snapshots). `recording/` measures one plain step into a
`solver.sac.SacProblem`; `runtime/` runs a region with its plan. The solving is torch-free, in
solver/sac/.
"""
