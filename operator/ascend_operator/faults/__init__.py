"""Why a pod ended: the cluster's disruptions, node and device faults, the failure's own line."""
