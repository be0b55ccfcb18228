"""The extension interfaces: provider, policy, queue/node/telemetry sources and the workload
scheduler, each optional capability a small declared protocol, and the entry-point registry."""
