"""The graph contract and the semantics: `graph` (validation, `Problem`), `simulate` (the
independent checker), `stages` (stage plans and their ops), `schedule` (`Schedule` and its
file), `budget` (budget text)."""
