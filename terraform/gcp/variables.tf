variable "project" {
  description = "The project the controller launches VMs in (the controller config's providers.gcp.project)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project id: 6-30 lowercase letters, digits or -, starting with a letter."
  }
}

variable "fleet_id" {
  description = "The controller's fleet_id; named in the role's description so that two fleets' roles are told apart."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$", var.fleet_id))
    error_message = "fleet_id must match the controller's name rule: a letter or digit, then letters, digits, _ . : or -, at most 128 characters."
  }
}

variable "account_id" {
  description = "The service account's id (the part before @)."
  type        = string
  default     = "gpu-autoscaler"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.account_id))
    error_message = "account_id must be 6-30 lowercase letters, digits or -, starting with a letter."
  }
}

variable "role_id" {
  description = "The custom role's id in the project."
  type        = string
  default     = "gpuAutoscalerController"

  validation {
    condition     = can(regex("^[a-zA-Z0-9_.]{3,64}$", var.role_id))
    error_message = "role_id must be 3-64 letters, digits, _ or ."
  }
}

variable "workload_identity" {
  description = "GKE Workload Identity: the controller's Kubernetes service account as NAMESPACE/NAME, allowed to act as the service account. Null: no binding (use the service account another way, e.g. as a VM's)."
  type        = string
  default     = null

  validation {
    condition     = var.workload_identity == null || can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", var.workload_identity))
    error_message = "workload_identity must be NAMESPACE/NAME with Kubernetes names (lowercase letters, digits, - and .)."
  }
}

variable "workload_identity_project" {
  description = "The project of the GKE cluster whose workload pool the Kubernetes service account is in. Null: the same project."
  type        = string
  default     = null
}
