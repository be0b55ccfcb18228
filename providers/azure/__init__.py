"""Azure: spot and on-demand GPU VMs through ARM; azure-mgmt-compute, azure-identity and
azure-core are imported only by ``providers.azure.sdk``, and only when a client is made."""

from providers.azure.provider import AzureProvider

__all__ = ["AzureProvider"]
