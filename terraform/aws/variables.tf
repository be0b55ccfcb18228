variable "fleet_id" {
  description = "The controller's fleet_id. The role may launch, tag and terminate only instances whose gpu-autoscaler/fleet tag has this value."
  type        = string

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$", var.fleet_id))
    error_message = "fleet_id must match the controller's name rule: a letter or digit, then letters, digits, _ . : or -, at most 128 characters."
  }
}

variable "name_prefix" {
  description = "Prefix of the IAM role, instance profile, SQS queue and EventBridge rules this module creates."
  type        = string
  default     = "gpu-autoscaler"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,40}$", var.name_prefix))
    error_message = "name_prefix must be 1-40 letters, digits, _ or - (it becomes part of IAM role, SQS queue and EventBridge rule names)."
  }
}

variable "regions" {
  description = "Regions the controller launches in (the pools' regions). Empty: any region. The launch and terminate permissions are scoped to these."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for r in var.regions : can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", r))])
    error_message = "each region must be an AWS region name such as us-east-1."
  }
}

variable "create_instance_profile" {
  description = "Let EC2 assume the role and create an instance profile for it, for a controller running on an EC2 instance."
  type        = bool
  default     = false
}

variable "oidc_provider_arn" {
  description = "IRSA: the ARN of the EKS cluster's IAM OIDC provider. Set it to let the controller's Kubernetes service account assume the role. Null: no IRSA trust."
  type        = string
  default     = null

  validation {
    condition     = var.oidc_provider_arn == null || can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:oidc-provider/.+$", var.oidc_provider_arn))
    error_message = "oidc_provider_arn must be an IAM OIDC provider ARN (arn:aws:iam::123456789012:oidc-provider/oidc.eks.REGION.amazonaws.com/id/ID)."
  }
}

variable "service_account" {
  description = "IRSA: the controller's Kubernetes service account as NAMESPACE/NAME; only it may assume the role through the OIDC provider."
  type        = string
  default     = "gpu-autoscaler/gpu-autoscaler"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", var.service_account))
    error_message = "service_account must be NAMESPACE/NAME with Kubernetes names (lowercase letters, digits, - and .)."
  }
}

variable "node_role_arns" {
  description = "IAM roles the GPU nodes' launch templates attach (through their instance profiles). The controller may pass only these to EC2. Empty: launch templates carry no instance profile."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.node_role_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:role/.+$", a))])
    error_message = "each node_role_arns entry must be an IAM role ARN."
  }
}

variable "work_queue_arns" {
  description = "SQS work queues an sqs source of the controller counts demand from (GetQueueAttributes only). Empty: no sqs source."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.work_queue_arns : can(regex("^arn:aws[a-z-]*:sqs:[a-z0-9-]+:[0-9]{12}:.+$", a))])
    error_message = "each work_queue_arns entry must be an SQS queue ARN."
  }
}

variable "message_retention_seconds" {
  description = "How long an interruption event waits in the queue. A spot warning is worth acting on for its two minutes only, so a few minutes is enough; a longer retention replays stale events after an outage."
  type        = number
  default     = 600

  validation {
    condition     = var.message_retention_seconds >= 60 && var.message_retention_seconds <= 1209600
    error_message = "message_retention_seconds must be between 60 (SQS's minimum) and 1209600 (14 days)."
  }
}

variable "permissions_boundary_arn" {
  description = "An IAM permissions boundary to set on the controller's role, where the account requires one."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags for every resource this module creates."
  type        = map(string)
  default     = {}
}
