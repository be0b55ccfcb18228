output "project" {
  description = "The controller config's providers.gcp.project."
  value       = var.project
}

output "service_account_email" {
  description = "The controller's service account: annotate the Kubernetes service account with it (iam.gke.io/gcp-service-account), or run the controller's VM as it."
  value       = google_service_account.controller.email
}

output "role_id" {
  description = "The custom role's full id (projects/PROJECT/roles/ROLE)."
  value       = google_project_iam_custom_role.controller.id
}

output "permissions" {
  description = "The permissions the custom role grants."
  value       = google_project_iam_custom_role.controller.permissions
}
