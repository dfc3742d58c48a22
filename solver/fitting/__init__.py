"""`fit`'s torch-free part: the largest size whose step fits, proven (`search`, each size's
verdict by `probe`), counted on captures (`confirmation`), the bisection and affine fit over
sizes it shares with the baselines (`sizes`), per-block checkpointing's size (`per_block`), and
the answer (`result`)."""
