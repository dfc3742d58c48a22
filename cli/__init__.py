"""The `remat` command: `main` assembles every subcommand; `solve`, `profile`, `run`, `fit` and
`sac` each parse and print one. Library code never imports this package.
"""
