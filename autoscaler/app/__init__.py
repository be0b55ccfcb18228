"""The assembly that builds the controller from a config (live, sim, plan), the run loop and plan
mode."""
