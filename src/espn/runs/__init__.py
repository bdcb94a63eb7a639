"""A run as the assembly side knows it: its configuration (:mod:`~espn.runs.config`), the checks
before work, building, loading and resuming it; :mod:`espn.checkpoint` only reads and writes the
files, these modules decide what to build from them (see docs/checkpoints.md)."""
