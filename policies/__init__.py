"""Built-in policies. Each is registered under the ``gpu_autoscaler.policies`` entry point group."""
