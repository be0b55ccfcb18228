variable "resource_group_name" {
  description = "The existing resource group the fleet's VMs live in (the controller config's providers.azure.resource_group). The custom role is scoped to it."
  type        = string

  validation {
    condition     = can(regex("^[-\\w._()]{1,90}$", var.resource_group_name)) && !endswith(var.resource_group_name, ".")
    error_message = "resource_group_name must be 1-90 letters, digits, _ - . ( or ), not ending in a period."
  }
}

variable "fleet_id" {
  description = "The controller's fleet_id; part of the custom roles' names, which are unique in the tenant."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$", var.fleet_id))
    error_message = "fleet_id must match the controller's name rule: a letter or digit, then letters, digits, _ . : or -, at most 128 characters."
  }
}

variable "subnet_ids" {
  description = "The subnets the pools' VMs join (each pool's options.subnet_id). The identity may join these and no other."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) > 0 && alltrue([for id in var.subnet_ids : can(regex("(?i)^/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft.Network/virtualNetworks/[^/]+/subnets/[^/]+$", id))])
    error_message = "subnet_ids must list at least one subnet resource id (/subscriptions/.../resourceGroups/.../providers/Microsoft.Network/virtualNetworks/.../subnets/...)."
  }
}

variable "identity_name" {
  description = "The user-assigned managed identity's name."
  type        = string
  default     = "gpu-autoscaler"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9_-]{2,127}$", var.identity_name))
    error_message = "identity_name must be 3-128 letters, digits, _ or -, starting with a letter or digit."
  }
}

variable "location" {
  description = "Where the identity lives. Null: the resource group's location."
  type        = string
  default     = null
}

variable "workload_identity" {
  description = "AKS workload identity: the controller's Kubernetes service account as NAMESPACE/NAME and the cluster's OIDC issuer URL. Null: no federated credential (attach the identity to a VM instead)."
  type = object({
    service_account = string
    oidc_issuer_url = string
  })
  default = null

  validation {
    condition = var.workload_identity == null || (
      can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", var.workload_identity.service_account)) &&
      startswith(var.workload_identity.oidc_issuer_url, "https://")
    )
    error_message = "workload_identity needs service_account as NAMESPACE/NAME and an https:// oidc_issuer_url."
  }
}

variable "tags" {
  description = "Tags for the identity."
  type        = map(string)
  default     = {}
}
