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

variable "node_service_accounts" {
  description = "The service accounts the GPU VMs run as (the pools' service_account option, by email). The controller may act as these alone (iam.serviceAccounts.actAs, in a role of its own bound on each account). Empty: the pools set no service_account."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for e in var.node_service_accounts : can(regex("^[a-z0-9][a-z0-9-]*@[a-z0-9][a-z0-9.-]*\\.gserviceaccount\\.com$", e))])
    error_message = "each node_service_accounts entry must be a service account's email (NAME@PROJECT.iam.gserviceaccount.com, or PROJECT_NUMBER-compute@developer.gserviceaccount.com for the default one)."
  }
}

variable "act_as_role_id" {
  description = "The id of the custom role holding iam.serviceAccounts.actAs, made only when node_service_accounts is not empty."
  type        = string
  default     = "gpuAutoscalerActAsNodes"

  validation {
    condition     = can(regex("^[a-zA-Z0-9_.]{3,64}$", var.act_as_role_id))
    error_message = "act_as_role_id must be 3-64 letters, digits, _ or ."
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
