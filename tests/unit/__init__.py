"""Unit tier: pure tests that start no process, agent or cluster (planning, validation, records, rendering)."""
