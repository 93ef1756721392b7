"""Pure functions from a validated spec to the Kubernetes objects the operator creates."""
