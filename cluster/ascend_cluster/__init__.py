"""The local cluster: a real Kubernetes control plane on this machine, and node agents that run pods as processes.

``build`` compiles etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and Kueue's manager from
their own Go modules (``controlplane/``); ``controlplane`` starts them with certificates of its own (``certificates``);
``runner`` is the node agent (a kubelet that runs each pod's container as a local process, ``pod_environment``,
``pod_network``); ``provisioner`` gives PersistentVolumeClaims host directories; ``kueue`` runs Kueue's manager
against the control plane; ``LocalCluster`` puts them together.
The operator runs against it unchanged, as on any cluster; the operator package imports nothing from here.
"""
