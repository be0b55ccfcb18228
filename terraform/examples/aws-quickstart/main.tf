# gpu-autoscaler on AWS alone (docs/quickstart-aws.md): the controller's role and interruption
# queue (../../aws), an SQS work queue whose messages are the demand, and the launch template the
# GPU nodes of both pools start from. The controller config is rendered from the outputs, once for
# SQS queue workers and once for Slurm (docs/quickstart-slurm.md).

data "aws_ssm_parameter" "dlami" {
  count = var.node_image_id == null ? 1 : 0
  name  = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
}

data "aws_ami" "node" {
  filter {
    name   = "image-id"
    values = [local.node_image_id]
  }
}

# Default subnets, in the zones that offer the instance type: a spot pool spread over zones finds
# capacity more often, and a zone without the type would only answer every launch with an error.
data "aws_ec2_instance_type_offerings" "gpu" {
  count         = length(var.subnet_ids) == 0 ? 1 : 0
  location_type = "availability-zone"
  filter {
    name   = "instance-type"
    values = [var.instance_type]
  }
}

data "aws_vpc" "default" {
  count   = length(var.subnet_ids) == 0 ? 1 : 0
  default = true
}

data "aws_subnets" "default" {
  count = length(var.subnet_ids) == 0 ? 1 : 0
  filter {
    name   = "vpc-id"
    values = [data.aws_vpc.default[0].id]
  }
  filter {
    name   = "default-for-az"
    values = ["true"]
  }
  filter {
    name   = "availability-zone"
    values = data.aws_ec2_instance_type_offerings.gpu[0].locations
  }
}

data "aws_subnet" "first" {
  id = local.subnet_ids[0]
}

locals {
  node_image_id = var.node_image_id == null ? nonsensitive(data.aws_ssm_parameter.dlami[0].value) : var.node_image_id
  subnet_ids    = length(var.subnet_ids) > 0 ? var.subnet_ids : sort(data.aws_subnets.default[0].ids)
}

# The controller: its role, trusted by EC2 (the instance profile of the host it runs on), allowed
# to pass only the nodes' role and to count only the work queue; the interruption queue and its
# EventBridge rules.
module "aws" {
  source                  = "../../aws"
  fleet_id                = var.fleet_id
  name_prefix             = var.name_prefix
  regions                 = [var.region]
  create_instance_profile = true
  node_role_arns          = [aws_iam_role.node.arn]
  work_queue_arns         = [aws_sqs_queue.work.arn]
}

# The demand: one message is one job of gpus_per_message GPUs (the sqs source's settings).
resource "aws_sqs_queue" "work" {
  name                    = "${var.name_prefix}-work"
  sqs_managed_sse_enabled = true
}

# The GPU nodes' own identity. It holds no permission here: attach what your workers need (to
# receive and delete the work queue's messages, to read their data).
data "aws_iam_policy_document" "node_trust" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  name               = "${var.name_prefix}-node"
  description        = "GPU nodes of gpu-autoscaler fleet ${var.fleet_id}"
  assume_role_policy = data.aws_iam_policy_document.node_trust.json
}

resource "aws_iam_instance_profile" "node" {
  name = "${var.name_prefix}-node"
  role = aws_iam_role.node.name
}

# Queue workers take no connection from outside the fleet; they reach out (the queue, the image
# registry). Slurm nodes talk with node_ingress_cidr_blocks both ways: slurmctld and the login
# nodes (slurmd, srun's ports) and the controller's host (the node agent's GPU readings on 9400).
resource "aws_security_group" "node" {
  name        = "${var.name_prefix}-node"
  description = "GPU nodes of gpu-autoscaler fleet ${var.fleet_id}"
  vpc_id      = data.aws_subnet.first.vpc_id

  dynamic "ingress" {
    for_each = length(var.node_ingress_cidr_blocks) > 0 ? [1] : []
    content {
      description = "Slurm (slurmctld, srun) and the controller (the node agent)"
      from_port   = 0
      to_port     = 65535
      protocol    = "tcp"
      cidr_blocks = var.node_ingress_cidr_blocks
    }
  }

  # Between the fleet's nodes, anything (a multi-node job's NCCL, MPI, EFA).
  ingress {
    description = "The fleet's other nodes"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }

  egress {
    description = "The fleet's other nodes"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    self        = true
  }

  # Out: HTTPS (AWS APIs such as the work queue, image and package registries, datasets) and
  # HTTP (OS packages); the VPC's DNS, NTP and instance metadata need no rule.
  egress {
    description = "HTTPS: AWS APIs, registries, datasets"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  egress {
    description = "HTTP: OS package mirrors"
    from_port   = 80
    to_port     = 80
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  dynamic "egress" {
    for_each = length(var.node_ingress_cidr_blocks) > 0 ? [1] : []
    content {
      description = "Slurm: slurmctld (6817) and the login nodes srun runs on"
      from_port   = 0
      to_port     = 65535
      protocol    = "tcp"
      cidr_blocks = var.node_ingress_cidr_blocks
    }
  }
}

# What both pools launch. The controller adds its tags to the instance at launch (RunInstances
# or CreateFleet TagSpecifications) and, for the Slurm variant, the join script as user data,
# which replaces the template's.
resource "aws_launch_template" "node" {
  name                   = "${var.name_prefix}-gpu-node"
  description            = "GPU nodes of gpu-autoscaler fleet ${var.fleet_id}"
  image_id               = local.node_image_id
  vpc_security_group_ids = [aws_security_group.node.id]
  update_default_version = true
  user_data              = var.node_user_data == "" ? null : base64encode(var.node_user_data)

  iam_instance_profile {
    arn = aws_iam_instance_profile.node.arn
  }

  # IMDSv2 only (the join script and the node agent use it), one hop: containers on the node
  # cannot read the node's credentials.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = data.aws_ami.node.root_device_name
    ebs {
      volume_size           = var.node_disk_gb
      volume_type           = "gp3"
      encrypted             = true
      delete_on_termination = true
    }
  }
}

locals {
  # What the two templates read.
  config_values = {
    fleet_id                = var.fleet_id
    region                  = var.region
    instance_type           = var.instance_type
    gpu_model               = var.gpu_model
    gres_type               = lower(var.gpu_model)
    gpus_per_instance       = var.gpus_per_instance
    spot_max_instances      = var.spot_max_instances
    on_demand_max_instances = var.on_demand_max_instances
    max_cost_per_hour       = var.max_cost_per_hour
    interruption_queue_url  = module.aws.interruption_queue_url
    work_queue_url          = aws_sqs_queue.work.url
    launch_template         = aws_launch_template.node.name
    subnets                 = local.subnet_ids
    slurmd_args             = "--conf-server ${var.slurm_conf_server}"
  }
}
