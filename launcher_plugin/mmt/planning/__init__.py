"""Stage 1, in the launcher process: a job's composed config becomes a validated, frozen plan (or a dry run)."""
