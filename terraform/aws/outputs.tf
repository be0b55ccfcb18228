output "role_arn" {
  description = "The controller's IAM role: annotate the Kubernetes service account with it (eks.amazonaws.com/role-arn) for IRSA."
  value       = aws_iam_role.controller.arn
}

output "role_name" {
  description = "The controller's IAM role name."
  value       = aws_iam_role.controller.name
}

output "instance_profile_name" {
  description = "The instance profile to start a controller on EC2 with; null unless create_instance_profile."
  value       = var.create_instance_profile ? aws_iam_instance_profile.controller[0].name : null
}

output "interruption_queue_url" {
  description = "The controller config's providers.aws.interruption_queue_url."
  value       = aws_sqs_queue.interruptions.url
}

output "interruption_queue_arn" {
  description = "The interruption queue's ARN."
  value       = aws_sqs_queue.interruptions.arn
}

output "region" {
  description = "The region of the queue and the event rules: EventBridge delivers only this region's events to them."
  value       = data.aws_region.current.name
}

output "event_rule_arns" {
  description = "The EventBridge rules feeding the queue, by event kind."
  value       = { for kind, rule in aws_cloudwatch_event_rule.interruptions : kind => rule.arn }
}
