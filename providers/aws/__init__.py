"""AWS: EC2 spot and on-demand GPU instances, the SQS interruption watcher and the SQS queue
source; boto3 is imported only by ``providers.aws.sdk``, and only when a client is made."""

from providers.aws.provider import AwsProvider

__all__ = ["AwsProvider"]
