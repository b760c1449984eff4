"""End-to-end tier: real processes (the app, its agents and ranks), the SLURM test cluster, a browser."""
