# gpu-autoscaler on Azure alone (docs/quickstart-azure.md): a resource group and a network for the
# fleet, and the controller's managed identity with its roles (../../azure) scoped to that group
# and subnet. The controller config is rendered from the outputs, once for a Redis work queue and
# once for Slurm (docs/quickstart-slurm.md).

resource "azurerm_resource_group" "fleet" {
  name     = var.resource_group
  location = var.location
}

resource "azurerm_virtual_network" "gpu" {
  name                = "gpu-autoscaler"
  resource_group_name = azurerm_resource_group.fleet.name
  location            = azurerm_resource_group.fleet.location
  address_space       = [var.address_space]
}

resource "azurerm_subnet" "gpu" {
  name                 = "gpu-autoscaler"
  resource_group_name  = azurerm_resource_group.fleet.name
  virtual_network_name = azurerm_virtual_network.gpu.name
  address_prefixes     = [cidrsubnet(var.address_space, 4, 0)]
}

# Azure's default rules already let the virtual network (and networks joined to it by a VPN or
# ExpressRoute gateway, such as an on-prem Slurm cluster) in, and the internet out; the only rule
# added is SSH from admin_cidrs.
resource "azurerm_network_security_group" "gpu" {
  name                = "gpu-autoscaler"
  resource_group_name = azurerm_resource_group.fleet.name
  location            = azurerm_resource_group.fleet.location

  dynamic "security_rule" {
    for_each = length(var.admin_cidrs) > 0 ? [1] : []
    content {
      name                       = "ssh-from-admins"
      priority                   = 100
      direction                  = "Inbound"
      access                     = "Allow"
      protocol                   = "Tcp"
      source_port_range          = "*"
      destination_port_range     = "22"
      source_address_prefixes    = var.admin_cidrs
      destination_address_prefix = "VirtualNetwork"
    }
  }
}

resource "azurerm_subnet_network_security_group_association" "gpu" {
  subnet_id                 = azurerm_subnet.gpu.id
  network_security_group_id = azurerm_network_security_group.gpu.id
}

# The controller: a user-assigned managed identity (attach it to the controller's VM) with a
# custom role on the resource group and a subnet-join role on the subnet alone.
module "azure" {
  source              = "../../azure"
  resource_group_name = azurerm_resource_group.fleet.name
  fleet_id            = var.fleet_id
  subnet_ids          = [azurerm_subnet.gpu.id]
  location            = azurerm_resource_group.fleet.location
}

locals {
  # What the two templates read.
  config_values = {
    fleet_id                = var.fleet_id
    subscription_id         = module.azure.subscription_id
    resource_group          = module.azure.resource_group
    location                = var.location
    vm_size                 = var.vm_size
    gpu_model               = var.gpu_model
    gres_type               = lower(var.gpu_model)
    gpus_per_instance       = var.gpus_per_instance
    spot_max_instances      = var.spot_max_instances
    on_demand_max_instances = var.on_demand_max_instances
    max_cost_per_hour       = var.max_cost_per_hour
    image                   = var.node_image
    subnet_id               = azurerm_subnet.gpu.id
    ssh_public_key          = var.ssh_public_key
    slurmd_args             = "--conf-server ${var.slurm_conf_server}"
  }
}
