variable "fleet_id" {
  description = "The controller's fleet_id; every module scopes its identity to it."
  type        = string
  default     = "prod"
}

variable "aws_region" {
  description = "The AWS region of the pools, the interruption queue and its event rules."
  type        = string
  default     = "us-east-1"
}

variable "aws_launch_template" {
  description = "The launch template the AWS pool's GPU nodes start from."
  type        = string
  default     = "gpu-node"
}

variable "eks_oidc_provider_arn" {
  description = "The EKS cluster's IAM OIDC provider, for IRSA."
  type        = string
}

variable "gcp_project" {
  description = "The project GPU VMs are launched in."
  type        = string
}

variable "gcp_image" {
  description = "The GCP pool's boot image."
  type        = string
  default     = "projects/deeplearning-platform-release/global/images/family/common-cu121-debian-11"
}

variable "gke_project" {
  description = "The GKE cluster's project, for Workload Identity. Null: gcp_project."
  type        = string
  default     = null
}

variable "azure_subscription_id" {
  description = "The Azure subscription of the fleet's resource group."
  type        = string
}

variable "azure_resource_group" {
  description = "The existing resource group the Azure VMs live in."
  type        = string
}

variable "azure_subnet_id" {
  description = "The subnet the Azure pool's VMs join."
  type        = string
}

variable "aks_oidc_issuer_url" {
  description = "The OIDC issuer of the cluster the controller runs in, for Azure workload identity."
  type        = string
}

variable "ssh_public_key" {
  description = "The SSH public key the Azure VMs accept."
  type        = string
}

variable "service_account" {
  description = "The controller's Kubernetes service account, NAMESPACE/NAME."
  type        = string
  default     = "gpu-autoscaler/gpu-autoscaler"
}
