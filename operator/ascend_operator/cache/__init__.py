"""What the operator knows of the cluster: informers, their caches and the work queue."""
