output "controller_config" {
  description = "The controller config for a Redis work queue: terraform output -raw controller_config > config.yaml (the same as examples/quickstart/azure.yaml with this subscription's values)."
  value       = templatefile("${path.module}/controller-config.yaml.tftpl", local.config_values)
}

output "controller_config_slurm" {
  description = "The controller config for a Slurm cluster bursting to the same pools (docs/quickstart-slurm.md; examples/quickstart/azure-slurm.yaml)."
  value       = templatefile("${path.module}/controller-config-slurm.yaml.tftpl", local.config_values)
}

output "identity_id" {
  description = "The controller's managed identity: attach it to the controller's VM (az vm create --assign-identity ...)."
  value       = module.azure.identity_id
}

output "client_id" {
  description = "The identity's client id: AZURE_CLIENT_ID in the controller's environment."
  value       = module.azure.client_id
}

output "subnet_id" {
  description = "The subnet of the GPU VMs and of the controller's VM."
  value       = azurerm_subnet.gpu.id
}

output "resource_group" {
  description = "The fleet's resource group."
  value       = azurerm_resource_group.fleet.name
}
