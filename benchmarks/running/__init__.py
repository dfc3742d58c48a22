"""The runtimes on real models: measured peaks, step times, exactness against eager."""
