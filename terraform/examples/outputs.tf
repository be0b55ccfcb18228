output "controller_config" {
  description = "The controller config: terraform output -raw controller_config > config.yaml, then gpu-autoscaler validate config.yaml."
  value       = local.controller_config
}

output "service_account_annotations" {
  description = "Annotations of the controller's Kubernetes service account, one per cloud's workload identity."
  value = {
    "eks.amazonaws.com/role-arn"        = module.aws.role_arn
    "iam.gke.io/gcp-service-account"    = module.gcp.service_account_email
    "azure.workload.identity/client-id" = module.azure.client_id
  }
}
