variable "project" {
  description = "The project the GPU VMs are launched in; give the fleet a project of its own, since the controller's role is project-wide."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project))
    error_message = "project must be a project id: 6-30 lowercase letters, digits or -, starting with a letter."
  }
}

variable "fleet_id" {
  description = "The controller's fleet_id; its VMs carry it as a label."
  type        = string
  default     = "quickstart"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$", var.fleet_id))
    error_message = "fleet_id must be a letter or digit, then letters, digits, _ . : or -, at most 128 characters."
  }
}

variable "region" {
  description = "The region of the pools and of the network this example makes."
  type        = string
  default     = "us-central1"
}

variable "zones" {
  description = "The zones the pools spread their VMs over (each must offer machine_type's GPU)."
  type        = list(string)
  default     = ["us-central1-a", "us-central1-b", "us-central1-c"]

  validation {
    condition     = length(var.zones) > 0
    error_message = "zones must list at least one zone."
  }
}

variable "machine_type" {
  description = "The GPU machine type of both pools (the Spot pool and its on-demand fallback). The controller prices a2-highgpu-1g and a2-highgpu-8g from its shipped price history; another type needs providers.gcp.price_catalog (docs/quickstart-gcp.md)."
  type        = string
  default     = "a2-highgpu-1g"
}

variable "gpu_model" {
  description = "The GPU model of machine_type, as the controller's pools name it (the Slurm variant's gres type is its lower case)."
  type        = string
  default     = "A100"
}

variable "gpus_per_instance" {
  description = "GPUs in one VM of machine_type."
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
  default     = 10
}

variable "node_image" {
  description = "The GPU VMs' boot image. The default, a Deep Learning VM image family, installs the NVIDIA driver at first boot (the pools' install-nvidia-driver metadata); the Slurm variant needs an image with slurmd and munge (docs/quickstart-slurm.md)."
  type        = string
  default     = "projects/deeplearning-platform-release/global/images/family/common-cu121-debian-11"
}

variable "subnet_cidr" {
  description = "The address range of the subnetwork the GPU VMs and the controller's VM use."
  type        = string
  default     = "10.40.0.0/20"

  validation {
    condition     = can(cidrhost(var.subnet_cidr, 0))
    error_message = "subnet_cidr must be a CIDR block."
  }
}

variable "node_ingress_ranges" {
  description = "Networks the GPU VMs accept TCP from: for Slurm, slurmctld's and the login nodes' (slurmd, srun). The controller's VM reaches the node agents by its network tag. Empty: none."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.node_ingress_ranges : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "each node_ingress_ranges entry must be a CIDR block, and not 0.0.0.0/0."
  }
}

variable "slurm_conf_server" {
  description = "The Slurm variant only: slurmctld's host:port, for the nodes' slurmd --conf-server (configless Slurm)."
  type        = string
  default     = "slurmctld.example.internal:6817"
}
