terraform {
  required_version = ">= 1.5.0, < 2.0.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.30.0, < 7.0.0"
    }
  }
}

provider "aws" {
  region = var.region
}
