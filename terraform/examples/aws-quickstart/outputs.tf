output "controller_config" {
  description = "The controller config for SQS queue workers: terraform output -raw controller_config > config.yaml (the same as examples/quickstart/aws.yaml with this account's values)."
  value       = templatefile("${path.module}/controller-config.yaml.tftpl", local.config_values)
}

output "controller_config_slurm" {
  description = "The controller config for a Slurm cluster bursting to the same pools (docs/quickstart-slurm.md; examples/quickstart/aws-slurm.yaml)."
  value       = templatefile("${path.module}/controller-config-slurm.yaml.tftpl", local.config_values)
}

output "controller_instance_profile" {
  description = "The instance profile to start the controller's host with (aws ec2 run-instances --iam-instance-profile Name=...)."
  value       = module.aws.instance_profile_name
}

output "controller_role_arn" {
  description = "The controller's IAM role, which the instance profile carries."
  value       = module.aws.role_arn
}

output "work_queue_url" {
  description = "The SQS work queue: one message is one pending job."
  value       = aws_sqs_queue.work.url
}

output "interruption_queue_url" {
  description = "The queue EventBridge delivers spot interruption warnings to (providers.aws.interruption_queue_url)."
  value       = module.aws.interruption_queue_url
}

output "launch_template_name" {
  description = "The GPU nodes' launch template (both pools' options.launch_template)."
  value       = aws_launch_template.node.name
}

output "node_role_name" {
  description = "The GPU nodes' IAM role: attach your workers' permissions to it."
  value       = aws_iam_role.node.name
}
