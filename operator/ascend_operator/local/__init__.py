"""The embedded local cluster: a Kubernetes API on loopback plus a local pod runner.

The operator code that runs in a real cluster runs unchanged against it (``make demo``, the operator and e2e
test tiers). ``LocalApiServer`` serves the API, ``PodRunner`` plays kubelet and scheduler for one node,
``LocalCluster`` puts both together; ``ascend-train`` is the command line.
"""
