variable "subscription_id" {
  description = "The subscription the fleet's resource group is made in."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", var.subscription_id))
    error_message = "subscription_id must be a subscription GUID."
  }
}

variable "ssh_public_key" {
  description = "The SSH public key the GPU VMs accept (Azure requires one for a Linux VM; the pools' options.ssh_public_key)."
  type        = string

  validation {
    condition     = can(regex("^(ssh-(rsa|ed25519)|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+( .*)?$", var.ssh_public_key))
    error_message = "ssh_public_key must be an OpenSSH public key line (ssh-ed25519 AAAA... comment)."
  }
}

variable "fleet_id" {
  description = "The controller's fleet_id; its VMs carry it as a tag."
  type        = string
  default     = "quickstart"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$", var.fleet_id))
    error_message = "fleet_id must be a letter or digit, then letters, digits, _ . : or -, at most 128 characters."
  }
}

variable "resource_group" {
  description = "The resource group this example makes for the fleet: the controller's role is scoped to it."
  type        = string
  default     = "gpu-autoscaler"

  validation {
    condition     = can(regex("^[-\\w._()]{1,90}$", var.resource_group)) && !endswith(var.resource_group, ".")
    error_message = "resource_group must be 1-90 letters, digits, _ - . ( or ), not ending in a period."
  }
}

variable "location" {
  description = "The region of the resource group, the network and the pools."
  type        = string
  default     = "eastus"
}

variable "vm_size" {
  description = "The GPU VM size of both pools (the Spot pool and its on-demand fallback)."
  type        = string
  default     = "Standard_NC4as_T4_v3"
}

variable "gpu_model" {
  description = "The GPU model of vm_size, as the controller's pools name it (the Slurm variant's gres type is its lower case)."
  type        = string
  default     = "T4"
}

variable "gpus_per_instance" {
  description = "GPUs in one VM of vm_size."
  type        = number
  default     = 1

  validation {
    condition     = var.gpus_per_instance >= 1 && floor(var.gpus_per_instance) == var.gpus_per_instance
    error_message = "gpus_per_instance must be a whole number of at least 1."
  }
}

variable "spot_max_instances" {
  description = "The most VMs of the Spot pool."
  type        = number
  default     = 2
}

variable "on_demand_max_instances" {
  description = "The most VMs of the on-demand pool, the fallback when Spot has no capacity or the work must stay off Spot."
  type        = number
  default     = 1
}

variable "max_cost_per_hour" {
  description = "The controller's budget in dollars per hour over both pools (limits.max_cost_per_hour)."
  type        = number
  default     = 5
}

variable "node_image" {
  description = "The GPU VMs' image, publisher:offer:sku:version or an image id. The default, the Azure HPC image for Ubuntu 22.04, carries the NVIDIA driver; the Slurm variant needs an image with slurmd and munge (docs/quickstart-slurm.md)."
  type        = string
  default     = "microsoft-dsvm:ubuntu-hpc:2204:latest"
}

variable "address_space" {
  description = "The virtual network's address space; the subnet of the GPU VMs and the controller's VM is its first /20."
  type        = string
  default     = "10.50.0.0/16"

  validation {
    condition     = can(cidrsubnet(var.address_space, 4, 0))
    error_message = "address_space must be a CIDR block of /16 to /28 - 4 bits."
  }
}

variable "admin_cidrs" {
  description = "Addresses allowed to SSH to the VMs of the subnet (the controller's VM). Empty: none (use az vm run-command or a Bastion)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.admin_cidrs : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "each admin_cidrs entry must be a CIDR block, and not 0.0.0.0/0."
  }
}

variable "slurm_conf_server" {
  description = "The Slurm variant only: slurmctld's host:port, for the nodes' slurmd --conf-server (configless Slurm)."
  type        = string
  default     = "slurmctld.example.internal:6817"
}
