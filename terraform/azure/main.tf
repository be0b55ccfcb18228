# The controller's identity on Azure: a user-assigned managed identity with a custom role,
# scoped to the fleet's resource group, holding only the actions the modules of providers/azure/
# need (tests/test_terraform.py checks both directions), and a second role that may only join the
# pools' subnets, assigned on those subnets alone (they usually live in another group).
#
# Azure RBAC cannot condition compute actions on tags, so the fleet tag is enforced by the
# provider (it lists and deletes only VMs carrying it) and the blast radius by the group scope.

data "azurerm_subscription" "current" {}

data "azurerm_resource_group" "fleet" {
  name = var.resource_group_name
}

locals {
  controller_actions = [
    # virtual_machines.list
    "Microsoft.Compute/virtualMachines/read",
    # virtual_machines.instance_view: a spot VM's eviction and power state
    "Microsoft.Compute/virtualMachines/instanceView/read",
    # virtual_machines.begin_create_or_update, and what the VM body makes ARM do besides:
    "Microsoft.Compute/virtualMachines/write",
    "Microsoft.Compute/disks/write",                    # the managed OS disk, created with the VM
    "Microsoft.Network/networkInterfaces/write",        # networkInterfaceConfigurations: ARM creates the NIC
    "Microsoft.Network/networkInterfaces/join/action",  # and attaches it to the VM
    # virtual_machines.begin_delete, and the OS disk and NIC deleted with it (deleteOption: Delete)
    "Microsoft.Compute/virtualMachines/delete",
    "Microsoft.Compute/disks/delete",
    "Microsoft.Network/networkInterfaces/delete",
    # gangs (providers/azure/gang.py): proximity_placement_groups.get and .create_or_update,
    # the pool's proximity placement group, read and made when asked, in this resource group
    "Microsoft.Compute/proximityPlacementGroups/read",
    "Microsoft.Compute/proximityPlacementGroups/write",
  ]
  subnet_actions = [
    # the NIC's ip configuration names the pool's subnet
    "Microsoft.Network/virtualNetworks/subnets/join/action",
  ]
}

resource "azurerm_user_assigned_identity" "controller" {
  name                = var.identity_name
  resource_group_name = data.azurerm_resource_group.fleet.name
  location            = coalesce(var.location, data.azurerm_resource_group.fleet.location)
  tags                = var.tags
}

resource "azurerm_role_definition" "controller" {
  name              = "gpu-autoscaler controller ${var.fleet_id} (${var.resource_group_name})"
  scope             = data.azurerm_resource_group.fleet.id
  description       = "Only what gpu-autoscaler's Azure provider calls, in one resource group."
  assignable_scopes = [data.azurerm_resource_group.fleet.id]

  permissions {
    actions     = local.controller_actions
    not_actions = []
  }
}

resource "azurerm_role_assignment" "controller" {
  scope              = data.azurerm_resource_group.fleet.id
  role_definition_id = azurerm_role_definition.controller.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.controller.principal_id
  principal_type     = "ServicePrincipal"
}

resource "azurerm_role_definition" "subnet_join" {
  name              = "gpu-autoscaler subnet join ${var.fleet_id} (${var.resource_group_name})"
  scope             = data.azurerm_subscription.current.id
  description       = "Join gpu-autoscaler's VMs' network interfaces to the pools' subnets."
  assignable_scopes = var.subnet_ids

  permissions {
    actions     = local.subnet_actions
    not_actions = []
  }
}

resource "azurerm_role_assignment" "subnet_join" {
  for_each           = toset(var.subnet_ids)
  scope              = each.value
  role_definition_id = azurerm_role_definition.subnet_join.role_definition_resource_id
  principal_id       = azurerm_user_assigned_identity.controller.principal_id
  principal_type     = "ServicePrincipal"
}

resource "azurerm_federated_identity_credential" "workload_identity" {
  count               = var.workload_identity == null ? 0 : 1
  name                = "kubernetes-${replace(var.workload_identity.service_account, "/", "-")}"
  resource_group_name = data.azurerm_resource_group.fleet.name
  parent_id           = azurerm_user_assigned_identity.controller.id
  audience            = ["api://AzureADTokenExchange"]
  issuer              = var.workload_identity.oidc_issuer_url
  subject             = "system:serviceaccount:${replace(var.workload_identity.service_account, "/", ":")}"
}
