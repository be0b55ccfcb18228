# One controller, three clouds: each module's outputs fill the controller config
# (controller-config.yaml.tftpl) and the Kubernetes service account's annotations.

module "aws" {
  source            = "../aws"
  fleet_id          = var.fleet_id
  regions           = [var.aws_region]
  oidc_provider_arn = var.eks_oidc_provider_arn
  service_account   = var.service_account
}

module "gcp" {
  source                    = "../gcp"
  project                   = var.gcp_project
  fleet_id                  = var.fleet_id
  workload_identity         = var.service_account
  workload_identity_project = var.gke_project
}

module "azure" {
  source              = "../azure"
  resource_group_name = var.azure_resource_group
  fleet_id            = var.fleet_id
  subnet_ids          = [var.azure_subnet_id]
  workload_identity = {
    service_account = var.service_account
    oidc_issuer_url = var.aks_oidc_issuer_url
  }
}

locals {
  # What the template reads: module outputs, and the pools' settings from the variables.
  config_values = {
    fleet_id               = var.fleet_id
    aws_region             = module.aws.region
    interruption_queue_url = module.aws.interruption_queue_url
    aws_role_arn           = module.aws.role_arn
    aws_launch_template    = var.aws_launch_template
    gcp_project            = module.gcp.project
    gcp_service_account    = module.gcp.service_account_email
    gcp_image              = var.gcp_image
    azure_subscription_id  = module.azure.subscription_id
    azure_resource_group   = module.azure.resource_group
    azure_client_id        = module.azure.client_id
    azure_subnet_id        = var.azure_subnet_id
    ssh_public_key         = var.ssh_public_key
  }
  controller_config = templatefile("${path.module}/controller-config.yaml.tftpl", local.config_values)
}
