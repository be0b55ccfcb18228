# The controller's identity: one role with only the EC2 and SQS actions the modules of
# providers/aws/ call (tests/test_terraform.py checks both directions), trusted by EC2 (instance
# profile) and/or one Kubernetes service account (IRSA).

data "aws_partition" "current" {}
data "aws_caller_identity" "current" {}
data "aws_region" "current" {}

locals {
  partition = data.aws_partition.current.partition
  account   = data.aws_caller_identity.current.account_id
  # ARN region parts: the pools' regions, or any region.
  arn_regions = length(var.regions) > 0 ? var.regions : ["*"]
  oidc_issuer = var.oidc_provider_arn == null ? null : element(split(":oidc-provider/", var.oidc_provider_arn), 1)

  # Resources a launch reads or creates besides the instance itself. They carry no fleet tag
  # (the provider tags only the instance), so a tag condition cannot apply to them; the
  # instance they belong to must carry it (statement LaunchOnlyFleetTaggedInstances).
  launch_resource_types = [
    "image",
    "snapshot",
    "subnet",
    "security-group",
    "network-interface",
    "volume",
    "key-pair",
    "launch-template",
    "placement-group",
    "spot-instances-request",
    "fleet",
  ]
  launch_resources = flatten([
    for region in local.arn_regions : concat(
      # public AMIs and snapshots belong to other accounts
      ["arn:${local.partition}:ec2:${region}::image/*", "arn:${local.partition}:ec2:${region}::snapshot/*"],
      [for type in local.launch_resource_types : "arn:${local.partition}:ec2:${region}:${local.account}:${type}/*"],
    )
  ])
  instances = [for region in local.arn_regions : "arn:${local.partition}:ec2:${region}:${local.account}:instance/*"]
  # The cluster placement groups a pool's placement_group: {create: true} makes for its gangs.
  placement_groups = [for region in local.arn_regions : "arn:${local.partition}:ec2:${region}:${local.account}:placement-group/*"]
}

data "aws_iam_policy_document" "trust" {
  dynamic "statement" {
    for_each = var.create_instance_profile ? [1] : []
    content {
      sid     = "Ec2InstanceProfile"
      effect  = "Allow"
      actions = ["sts:AssumeRole"]
      principals {
        type        = "Service"
        identifiers = ["ec2.amazonaws.com"]
      }
    }
  }

  dynamic "statement" {
    for_each = var.oidc_provider_arn == null ? [] : [1]
    content {
      sid     = "KubernetesServiceAccount"
      effect  = "Allow"
      actions = ["sts:AssumeRoleWithWebIdentity"]
      principals {
        type        = "Federated"
        identifiers = [var.oidc_provider_arn]
      }
      condition {
        test     = "StringEquals"
        variable = "${local.oidc_issuer}:sub"
        values   = ["system:serviceaccount:${replace(var.service_account, "/", ":")}"]
      }
      condition {
        test     = "StringEquals"
        variable = "${local.oidc_issuer}:aud"
        values   = ["sts.amazonaws.com"]
      }
    }
  }
}

data "aws_iam_policy_document" "controller" {
  # Listing and prices. EC2's Describe actions support no resource-level permissions.
  statement {
    sid    = "DescribeFleet"
    effect = "Allow"
    actions = [
      "ec2:DescribeInstanceStatus",
      "ec2:DescribeInstances",
      "ec2:DescribePlacementGroups",
      "ec2:DescribeSpotPriceHistory",
      "ec2:DescribeTags",
    ]
    resources = ["*"]
  }

  # RunInstances (one shape) and CreateFleet of type instant (several) authorise every resource
  # the launch touches; only the instance is ours to create, so only it needs the tag.
  statement {
    sid       = "LaunchWithSharedResources"
    effect    = "Allow"
    actions   = ["ec2:CreateFleet", "ec2:RunInstances"]
    resources = local.launch_resources
  }

  statement {
    sid       = "LaunchOnlyFleetTaggedInstances"
    effect    = "Allow"
    actions   = ["ec2:CreateFleet", "ec2:RunInstances"]
    resources = local.instances
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/gpu-autoscaler/fleet"
      values   = [var.fleet_id]
    }
  }

  # TagSpecifications make EC2 authorise CreateTags too; allowed only as part of a launch and
  # only with our fleet tag, so the role can never re-tag an existing instance into the fleet.
  statement {
    sid       = "TagOnlyAtLaunch"
    effect    = "Allow"
    actions   = ["ec2:CreateTags"]
    resources = local.instances
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["CreateFleet", "RunInstances"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/gpu-autoscaler/fleet"
      values   = [var.fleet_id]
    }
  }

  # A gang's cluster placement group (providers/aws/gang.py), made only with our fleet tag and
  # tagged only as it is made. Launching into an existing group is LaunchWithSharedResources.
  statement {
    sid       = "CreateOnlyFleetTaggedPlacementGroups"
    effect    = "Allow"
    actions   = ["ec2:CreatePlacementGroup"]
    resources = local.placement_groups
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/gpu-autoscaler/fleet"
      values   = [var.fleet_id]
    }
  }

  statement {
    sid       = "TagPlacementGroupsOnlyAtCreation"
    effect    = "Allow"
    actions   = ["ec2:CreateTags"]
    resources = local.placement_groups
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["CreatePlacementGroup"]
    }
    condition {
      test     = "StringEquals"
      variable = "aws:RequestTag/gpu-autoscaler/fleet"
      values   = [var.fleet_id]
    }
  }

  statement {
    sid       = "TerminateOnlyFleetInstances"
    effect    = "Allow"
    actions   = ["ec2:TerminateInstances"]
    resources = local.instances
    condition {
      test     = "StringEquals"
      variable = "aws:ResourceTag/gpu-autoscaler/fleet"
      values   = [var.fleet_id]
    }
  }

  # The launch templates' instance profiles: only the given roles, and only to EC2.
  dynamic "statement" {
    for_each = length(var.node_role_arns) > 0 ? [1] : []
    content {
      sid       = "PassNodeRoles"
      effect    = "Allow"
      actions   = ["iam:PassRole"]
      resources = var.node_role_arns
      condition {
        test     = "StringEquals"
        variable = "iam:PassedToService"
        values   = ["ec2.amazonaws.com"]
      }
    }
  }

  statement {
    sid       = "ReadInterruptionQueue"
    effect    = "Allow"
    actions   = ["sqs:DeleteMessage", "sqs:ReceiveMessage"]
    resources = [aws_sqs_queue.interruptions.arn]
  }

  dynamic "statement" {
    for_each = length(var.work_queue_arns) > 0 ? [1] : []
    content {
      sid       = "CountWorkQueues"
      effect    = "Allow"
      actions   = ["sqs:GetQueueAttributes"]
      resources = var.work_queue_arns
    }
  }
}

resource "aws_iam_role" "controller" {
  name                 = "${var.name_prefix}-controller"
  description          = "gpu-autoscaler controller for fleet ${var.fleet_id}"
  assume_role_policy   = data.aws_iam_policy_document.trust.json
  permissions_boundary = var.permissions_boundary_arn
  tags                 = var.tags

  lifecycle {
    precondition {
      condition     = var.create_instance_profile || var.oidc_provider_arn != null
      error_message = "Nothing could assume the role: set create_instance_profile = true, oidc_provider_arn, or both."
    }
  }
}

resource "aws_iam_role_policy" "controller" {
  name   = "${var.name_prefix}-controller"
  role   = aws_iam_role.controller.id
  policy = data.aws_iam_policy_document.controller.json
}

resource "aws_iam_instance_profile" "controller" {
  count = var.create_instance_profile ? 1 : 0
  name  = "${var.name_prefix}-controller"
  role  = aws_iam_role.controller.name
  tags  = var.tags
}
