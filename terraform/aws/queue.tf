# The interruption queue: EventBridge delivers the EC2 and AWS Health events that
# providers/aws/events.py reads, one rule per event kind; only those rules may send to it.

locals {
  # detail-type => the rule's event pattern. The detail-types are the ones
  # providers/aws/events.py handles (tests/test_terraform.py checks they match).
  event_rules = {
    spot-interruption = {
      description = "EC2 Spot Instance Interruption Warning: two minutes before a spot instance is reclaimed"
      pattern = {
        source      = ["aws.ec2"]
        detail-type = ["EC2 Spot Instance Interruption Warning"]
      }
    }
    rebalance = {
      description = "EC2 Instance Rebalance Recommendation: a spot instance at elevated risk of interruption"
      pattern = {
        source      = ["aws.ec2"]
        detail-type = ["EC2 Instance Rebalance Recommendation"]
      }
    }
    state-change = {
      description = "EC2 Instance State-change Notification: an instance stopping or terminating, whoever asked"
      pattern = {
        source      = ["aws.ec2"]
        detail-type = ["EC2 Instance State-change Notification"]
        detail = {
          state = ["shutting-down", "terminated", "stopping", "stopped"]
        }
      }
    }
    scheduled-change = {
      description = "AWS Health Event: EC2 scheduled maintenance or retirement"
      pattern = {
        source      = ["aws.health"]
        detail-type = ["AWS Health Event"]
        detail = {
          service           = ["EC2"]
          eventTypeCategory = ["scheduledChange"]
        }
      }
    }
  }
}

# Messages the controller cannot read (malformed, or from an unexpected sender) are left on the
# queue, never deleted unseen; after three receives SQS moves them here for a person to look at.
resource "aws_sqs_queue" "interruptions_dead_letter" {
  name                      = "${var.name_prefix}-interruptions-dlq"
  message_retention_seconds = 1209600
  sqs_managed_sse_enabled   = true
  tags                      = var.tags
}

resource "aws_sqs_queue" "interruptions" {
  name                      = "${var.name_prefix}-interruptions"
  message_retention_seconds = var.message_retention_seconds
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.interruptions_dead_letter.arn
    maxReceiveCount     = 3
  })
  # The controller long-polls for up to 20 s (providers.aws.queue_wait_s).
  receive_wait_time_seconds = 20
  # SQS-managed server-side encryption: EventBridge can send to it without a key policy, and
  # the controller needs no KMS permission to read it.
  sqs_managed_sse_enabled = true
  tags                    = var.tags
}

data "aws_iam_policy_document" "queue" {
  statement {
    sid       = "OnlyTheFleetEventRules"
    effect    = "Allow"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.interruptions.arn]
    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }
    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [for rule in aws_cloudwatch_event_rule.interruptions : rule.arn]
    }
  }

  statement {
    sid       = "DenyPlainHttp"
    effect    = "Deny"
    actions   = ["sqs:*"]
    resources = [aws_sqs_queue.interruptions.arn]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_sqs_queue_policy" "interruptions" {
  queue_url = aws_sqs_queue.interruptions.id
  policy    = data.aws_iam_policy_document.queue.json
}

resource "aws_cloudwatch_event_rule" "interruptions" {
  for_each      = local.event_rules
  name          = "${var.name_prefix}-${each.key}"
  description   = each.value.description
  event_pattern = jsonencode(each.value.pattern)
  tags          = var.tags
}

resource "aws_cloudwatch_event_target" "interruptions" {
  for_each  = local.event_rules
  rule      = aws_cloudwatch_event_rule.interruptions[each.key].name
  target_id = "interruption-queue"
  arn       = aws_sqs_queue.interruptions.arn
}
