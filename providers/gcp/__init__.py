"""GCP: Compute Engine Spot and standard GPU VMs; google-cloud-compute and google-auth are
imported only by ``providers.gcp.sdk``, and only when a client is made."""

from providers.gcp.provider import GcpProvider

__all__ = ["GcpProvider"]
