"""`solve(..., offload=link)`: the exact search of the stage space with offload
(docs/offload.md). `search`: its steps (`solve_with_offload`); `runs`: the heuristic runs it
starts from and keeps its incumbent among; `model_step`: the exact offload model as one of its
steps."""
