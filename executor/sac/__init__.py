"""SAC plans: a solved plan run inside `torch.utils.checkpoint` (`checkpoint_plan` in
`planning`, `CheckpointPlan` in `plan`, the forwards it binds to its regions in
`planned_forward`). `blocks` chooses the regions, `record`, `windows`, `op_streams`, `facts`,
`overhead` and `step` measure one plain step into a `solver.sac.SacProblem`, `policy` and
`region` run a region with its plan. The solving is torch-free, in solver/sac/.
"""
