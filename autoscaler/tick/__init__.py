"""One tick: observe, the controller's own rules, guard, act, evacuate, and the controller that
runs them in order."""
