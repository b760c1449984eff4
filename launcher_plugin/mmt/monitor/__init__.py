"""Machine metrics, progress and plots of jobs."""
