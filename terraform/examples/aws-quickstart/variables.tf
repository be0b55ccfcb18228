variable "fleet_id" {
  description = "The controller's fleet_id: the role may launch, tag and terminate only instances carrying it."
  type        = string
  default     = "quickstart"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$", var.fleet_id))
    error_message = "fleet_id must be a letter or digit, then letters, digits, _ . : or -, at most 128 characters."
  }
}

variable "name_prefix" {
  description = "Prefix of every name this example creates (IAM roles, queues, the launch template, the security group)."
  type        = string
  default     = "gpu-autoscaler"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,40}$", var.name_prefix))
    error_message = "name_prefix must be 1-40 letters, digits, _ or -."
  }
}

variable "region" {
  description = "The region of the pools, the queues and the interruption events."
  type        = string
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "region must be an AWS region name such as us-east-1."
  }
}

variable "instance_type" {
  description = "The GPU instance type of both pools (the spot pool and its on-demand fallback)."
  type        = string
  default     = "g5.xlarge"
}

variable "gpu_model" {
  description = "The GPU model of instance_type, as the controller's pools name it (the Slurm variant's gres type is its lower case)."
  type        = string
  default     = "A10G"
}

variable "gpus_per_instance" {
  description = "GPUs in one instance of instance_type."
  type        = number
  default     = 1

  validation {
    condition     = var.gpus_per_instance >= 1 && floor(var.gpus_per_instance) == var.gpus_per_instance
    error_message = "gpus_per_instance must be a whole number of at least 1."
  }
}

variable "spot_max_instances" {
  description = "The most instances of the spot pool."
  type        = number
  default     = 2
}

variable "on_demand_max_instances" {
  description = "The most instances of the on-demand pool, the fallback when spot has no capacity or the work must stay off spot."
  type        = number
  default     = 1
}

variable "max_cost_per_hour" {
  description = "The controller's budget in dollars per hour over both pools (limits.max_cost_per_hour)."
  type        = number
  default     = 5
}

variable "node_image_id" {
  description = "The GPU nodes' AMI. Null: the latest AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) of the region, read from its public SSM parameter. The Slurm variant needs an image with slurmd and munge (docs/quickstart-slurm.md)."
  type        = string
  default     = null

  validation {
    condition     = var.node_image_id == null || can(regex("^ami-[0-9a-f]{8,17}$", var.node_image_id))
    error_message = "node_image_id must be an AMI id (ami-...)."
  }
}

variable "node_disk_gb" {
  description = "The GPU nodes' root volume in GiB (encrypted gp3); at least the AMI's own snapshot."
  type        = number
  default     = 150
}

variable "node_user_data" {
  description = "The queue workers' boot script, kept in the launch template (the SQS configuration gives its pools no user_data, so the template's stays). Empty: none. The Slurm variant's pools boot with the join script the controller renders instead."
  type        = string
  default     = ""
}

variable "subnet_ids" {
  description = "The subnets the GPU nodes launch in, one per zone to spread spot over. Empty: the default VPC's default subnets in the zones that offer instance_type."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for s in var.subnet_ids : can(regex("^subnet-[0-9a-f]{8,17}$", s))])
    error_message = "each subnet_ids entry must be a subnet id (subnet-...)."
  }
}

variable "slurm_conf_server" {
  description = "The Slurm variant only: slurmctld's host:port, for the nodes' slurmd --conf-server (configless Slurm)."
  type        = string
  default     = "slurmctld.example.internal:6817"
}

variable "node_ingress_cidr_blocks" {
  description = "Networks the GPU nodes accept TCP from: for Slurm, slurmctld's and the login nodes' (slurmd, srun) and the controller host's (the node agent on 9400). Empty: no inbound (queue workers)."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for c in var.node_ingress_cidr_blocks : can(cidrhost(c, 0)) && c != "0.0.0.0/0"])
    error_message = "each node_ingress_cidr_blocks entry must be a CIDR block, and not 0.0.0.0/0."
  }
}
