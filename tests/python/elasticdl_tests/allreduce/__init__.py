"""End-to-end tests of AllreduceStrategy jobs (local platform, real processes)."""
