"""The solver against its references and the heuristics: proofs, time limits, published graphs."""
