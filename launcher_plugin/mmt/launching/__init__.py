"""Stage 2, in the launcher process: submit plans to a backend, watch them, conclude and report each job."""
