"""GPU health: a read-only NVML probe, a policy per host role, pair qualification."""
