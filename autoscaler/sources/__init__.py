"""Adapters for on-prem signals: Slurm, Prometheus, Redis, scraped GPU telemetry. Each one
implements a protocol of ``autoscaler.spi.sources`` and is found by entry point."""
