"""`fit`'s torch-free part: the largest size whose step fits, proven (`search`), the bisection
and affine fit over sizes it shares with the baselines (`sizes`), and the answer (`result`)."""
