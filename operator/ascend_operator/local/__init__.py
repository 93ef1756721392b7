"""The embedded local cluster: a Kubernetes API on loopback plus emulated nodes.

The operator code that runs in a real cluster runs unchanged against it (``make demo``, the operator and e2e
test tiers). ``LocalApiServer`` serves the API, ``Scheduler`` plays kube-scheduler, ``NodeLifecycle`` the node
controllers of kube-controller-manager, one ``PodRunner`` per node the kubelet; ``LocalCluster`` puts them
together; ``ascend-train`` is the command line.
"""
