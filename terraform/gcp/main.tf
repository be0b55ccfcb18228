# The controller's identity on GCP: a service account holding a custom role with only the
# Compute Engine permissions the modules of providers/gcp/ need (tests/test_terraform.py checks
# both directions), bound at the project; the right to launch VMs that run as the given nodes'
# service accounts, on those accounts alone; optionally usable from one GKE service account.
#
# Why project-wide: IAM conditions cannot test a VM's labels, and the provider's VMs get
# generated names in any zone, so the fleet label cannot be enforced by IAM here; the provider
# lists, and deletes, only VMs carrying its fleet label (see docs/terraform.md).

locals {
  permissions = [
    # instances.aggregatedList and instances.list: listing the fleet by label
    "compute.instances.list",
    # instances.get: is a VM whose insert answered with an error there after all?
    "compute.instances.get",
    # instances.insert, and what an insert of providers/gcp/instances.py's VMs needs besides:
    "compute.instances.create",
    "compute.instances.setLabels", # the VMs are created with the fleet, pool and request labels
    "compute.disks.create",        # each VM's boot disk is created with it
    "compute.images.useReadOnly",  # the boot disk's image, when it is in this project
    "compute.subnetworks.use",     # the pool's subnetwork (or the default network's)
    # the pool's boot script (startup_script, or user_data: its own or the join script) and
    # its metadata option are the VM's metadata
    "compute.instances.setMetadata",
    # the pool's service_account option (acting as that account: node_service_accounts)
    "compute.instances.setServiceAccount",
    # instances.delete
    "compute.instances.delete",
    # zoneOperations.wait (an insert's operation) and zoneOperations.list (preemptions)
    "compute.zoneOperations.get",
    "compute.zoneOperations.list",
    # gangs (providers/gcp/gang.py): instances.bulkInsert is authorised as instances.create;
    # the pool's compact placement policy is read, made when asked, and used by the VMs
    "compute.resourcePolicies.get",
    "compute.resourcePolicies.create",
    "compute.resourcePolicies.use",
    # regionOperations.wait (a resource policy insert's operation)
    "compute.regionOperations.get",
  ]
  # Launching a VM that runs as a service account is acting as that account: granted on the
  # nodes' accounts alone, never project-wide (which would let the controller act as any
  # account of the project, its own admins' included).
  act_as_permissions = ["iam.serviceAccounts.actAs"]
  workload_project   = coalesce(var.workload_identity_project, var.project)
}

resource "google_service_account" "controller" {
  project      = var.project
  account_id   = var.account_id
  display_name = "gpu-autoscaler controller (${var.fleet_id})"
  description  = "Launches, lists and deletes the GPU VMs of gpu-autoscaler fleet ${var.fleet_id}."
}

resource "google_project_iam_custom_role" "controller" {
  project     = var.project
  role_id     = var.role_id
  title       = "gpu-autoscaler controller"
  description = "Only what gpu-autoscaler's GCP provider calls (fleet ${var.fleet_id})."
  permissions = local.permissions
}

resource "google_project_iam_member" "controller" {
  project = var.project
  role    = google_project_iam_custom_role.controller.id
  member  = "serviceAccount:${google_service_account.controller.email}"
}

resource "google_project_iam_custom_role" "act_as_nodes" {
  count       = length(var.node_service_accounts) > 0 ? 1 : 0
  project     = var.project
  role_id     = var.act_as_role_id
  title       = "gpu-autoscaler act as the GPU nodes' accounts"
  description = "Launch VMs that run as the GPU nodes' service accounts (fleet ${var.fleet_id})."
  permissions = local.act_as_permissions
}

# count, not for_each: an account made in the same apply has no email until then, and count
# needs only the list's length. The project is "-": IAM finds the account's own by its email.
resource "google_service_account_iam_member" "act_as_nodes" {
  count              = length(var.node_service_accounts)
  service_account_id = "projects/-/serviceAccounts/${var.node_service_accounts[count.index]}"
  role               = google_project_iam_custom_role.act_as_nodes[0].id
  member             = "serviceAccount:${google_service_account.controller.email}"
}

resource "google_service_account_iam_member" "workload_identity" {
  count              = var.workload_identity == null ? 0 : 1
  service_account_id = google_service_account.controller.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${local.workload_project}.svc.id.goog[${var.workload_identity}]"
}
