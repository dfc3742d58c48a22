"""Every schedule family the solver knows, in one registry (`registry.HEURISTICS`): checkpoint
policies (`baselines`, `rotor`), heuristics run at a budget (`eviction`, `backward`), LP
rounding (`rounding`) and the least-peak search (`least_peak`)."""
