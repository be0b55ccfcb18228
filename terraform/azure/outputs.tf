output "subscription_id" {
  description = "The controller config's providers.azure.subscription_id."
  value       = data.azurerm_subscription.current.subscription_id
}

output "resource_group" {
  description = "The controller config's providers.azure.resource_group."
  value       = data.azurerm_resource_group.fleet.name
}

output "client_id" {
  description = "The identity's client id: AZURE_CLIENT_ID for DefaultAzureCredential, or the azure.workload.identity/client-id annotation of the Kubernetes service account."
  value       = azurerm_user_assigned_identity.controller.client_id
}

output "principal_id" {
  description = "The identity's principal (object) id."
  value       = azurerm_user_assigned_identity.controller.principal_id
}

output "identity_id" {
  description = "The identity's resource id, to attach it to the controller's VM."
  value       = azurerm_user_assigned_identity.controller.id
}
