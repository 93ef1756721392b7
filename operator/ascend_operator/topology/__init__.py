"""Topology: NODE_RANK ordered by where a gang's pods landed (``order``, pure) and the reconcile's part in it
(``placement``). What a job asks for is ``api/topology.py``; how Kueue and kube-scheduler are told is in
``kueue/integration.py`` and ``render/gang.py``."""
