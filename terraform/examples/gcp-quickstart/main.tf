# gpu-autoscaler on GCP alone (docs/quickstart-gcp.md): the APIs an empty project lacks, the
# GPU VMs' own service account, the controller's service account and role (../../gcp) with the
# right to act as the nodes' account, and a network for both. The controller config is rendered
# from the outputs, once for a Redis work queue and once for Slurm (docs/quickstart-slurm.md).

# Compute Engine and IAM for everything here; IAP for SSH to the controller's VM, which has no
# external address.
resource "google_project_service" "apis" {
  for_each           = toset(["compute.googleapis.com", "iam.googleapis.com", "iap.googleapis.com"])
  project            = var.project
  service            = each.value
  disable_on_destroy = false
}

# The GPU VMs run as this account (the pools' service_account option). It holds no role here:
# grant it what your workers need (to read their data, write logs).
resource "google_service_account" "node" {
  project      = var.project
  account_id   = "gpu-autoscaler-node"
  display_name = "gpu-autoscaler GPU nodes (${var.fleet_id})"
  description  = "The GPU VMs of gpu-autoscaler fleet ${var.fleet_id} run as this account."
  depends_on   = [google_project_service.apis]
}

# The controller: a service account with a custom role holding what providers/gcp/ calls, the
# pools' metadata and service account included, and the right to act as the nodes' account on
# that account alone.
module "gcp" {
  source                = "../../gcp"
  project               = var.project
  fleet_id              = var.fleet_id
  node_service_accounts = [google_service_account.node.email]
  depends_on            = [google_project_service.apis]
}

# A network of the fleet's own (an empty project may have no default network). The VMs get no
# external address: they reach Google APIs through Private Google Access and the rest through
# Cloud NAT.
resource "google_compute_network" "gpu" {
  project                 = var.project
  name                    = "gpu-autoscaler"
  auto_create_subnetworks = false
  depends_on              = [google_project_service.apis]
}

resource "google_compute_subnetwork" "gpu" {
  project                  = var.project
  name                     = "gpu-autoscaler"
  region                   = var.region
  network                  = google_compute_network.gpu.id
  ip_cidr_range            = var.subnet_cidr
  private_ip_google_access = true

  log_config {
    aggregation_interval = "INTERVAL_10_MIN"
    flow_sampling        = 0.5
    metadata             = "INCLUDE_ALL_METADATA"
  }
}

resource "google_compute_router" "gpu" {
  project = var.project
  name    = "gpu-autoscaler"
  region  = var.region
  network = google_compute_network.gpu.id
}

resource "google_compute_router_nat" "gpu" {
  project                            = var.project
  name                               = "gpu-autoscaler"
  router                             = google_compute_router.gpu.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

# SSH to the controller's VM (network tag gpu-autoscaler-controller) through IAP only.
resource "google_compute_firewall" "controller_ssh" {
  project       = var.project
  name          = "gpu-autoscaler-controller-ssh"
  network       = google_compute_network.gpu.id
  direction     = "INGRESS"
  source_ranges = ["35.235.240.0/20"]
  target_tags   = ["gpu-autoscaler-controller"]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

# The controller's VM reads the node agents' GPU readings (the Slurm variant's scrape source).
resource "google_compute_firewall" "node_agent" {
  project     = var.project
  name        = "gpu-autoscaler-node-agent"
  network     = google_compute_network.gpu.id
  direction   = "INGRESS"
  source_tags = ["gpu-autoscaler-controller"]

  allow {
    protocol = "tcp"
    ports    = ["9400"]
  }
}

# The fleet's VMs among themselves (a multi-node job's NCCL or MPI).
resource "google_compute_firewall" "fleet" {
  project       = var.project
  name          = "gpu-autoscaler-fleet"
  network       = google_compute_network.gpu.id
  direction     = "INGRESS"
  source_ranges = [var.subnet_cidr]

  allow {
    protocol = "all"
  }
}

# Slurm: slurmctld and the login nodes reach slurmd and srun's ports.
resource "google_compute_firewall" "slurm" {
  count         = length(var.node_ingress_ranges) > 0 ? 1 : 0
  project       = var.project
  name          = "gpu-autoscaler-slurm"
  network       = google_compute_network.gpu.id
  direction     = "INGRESS"
  source_ranges = var.node_ingress_ranges

  allow {
    protocol = "tcp"
  }
}

locals {
  # What the two templates read.
  config_values = {
    fleet_id                = var.fleet_id
    project                 = module.gcp.project
    region                  = var.region
    zones                   = var.zones
    machine_type            = var.machine_type
    gpu_model               = var.gpu_model
    gres_type               = lower(var.gpu_model)
    gpus_per_instance       = var.gpus_per_instance
    spot_max_instances      = var.spot_max_instances
    on_demand_max_instances = var.on_demand_max_instances
    max_cost_per_hour       = var.max_cost_per_hour
    image                   = var.node_image
    subnetwork              = google_compute_subnetwork.gpu.id
    node_service_account    = google_service_account.node.email
    slurmd_args             = "--conf-server ${var.slurm_conf_server}"
  }
}
