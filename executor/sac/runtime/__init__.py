"""The runtime: a region run inside `torch.utils.checkpoint` under its plan (`policy` the SAC
policy, `region` the checkpoint call, `planned_forward` the forwards a plan binds to its
regions, `offload` the host copies of offloaded ops and parked regions)."""
