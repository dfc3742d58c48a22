"""The recording: one plain training step measured into a `solver.sac.SacProblem` (`record`:
the driver; `blocks` chooses the regions, `windows` the memory windows, `op_streams` and
`facts` each region's dispatched ops and their bytes, `overhead` and `region_timing` the
regions' prices, `alike` which regions repeat, `measurer` the device's bytes, seconds and RNG;
`estimate` the same on fake tensors for a target device)."""
