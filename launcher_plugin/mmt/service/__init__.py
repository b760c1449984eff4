"""The job service, in the submitting host's processes: the registry of jobs, submitting a command job (the CLI's and
the SDK's ``run``), re-attaching to a job from another process, and the state of a job as last seen."""
