output "controller_config" {
  description = "The controller config for a Redis work queue: terraform output -raw controller_config > config.yaml (the same as examples/quickstart/gcp.yaml with this project's values)."
  value       = templatefile("${path.module}/controller-config.yaml.tftpl", local.config_values)
}

output "controller_config_slurm" {
  description = "The controller config for a Slurm cluster bursting to the same pools (docs/quickstart-slurm.md; examples/quickstart/gcp-slurm.yaml)."
  value       = templatefile("${path.module}/controller-config-slurm.yaml.tftpl", local.config_values)
}

output "controller_service_account" {
  description = "The controller's service account: start its VM as it (gcloud compute instances create --service-account ...)."
  value       = module.gcp.service_account_email
}

output "node_service_account" {
  description = "The GPU VMs' service account: grant it what your workers need."
  value       = google_service_account.node.email
}

output "subnetwork" {
  description = "The subnetwork of the GPU VMs and of the controller's VM."
  value       = google_compute_subnetwork.gpu.name
}

output "controller_permissions" {
  description = "Every permission the controller's service account holds in the project (its custom role); it may act as node_service_account besides, on that account alone."
  value       = module.gcp.permissions
}
