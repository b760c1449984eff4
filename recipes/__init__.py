"""mmt's recipes: what every rank of a job runs. Each recipe reads its place from ``mmt.RankInfo``."""
