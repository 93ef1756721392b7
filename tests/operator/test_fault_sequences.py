"""Fault sequences as a tested property: Hypothesis drives random sequences of faults against the operator, a real
process, on the real control plane (kube-apiserver, kube-scheduler and kube-controller-manager's node lifecycle
and taint eviction), the test playing the kubelet of a few nodes of its own (``fake_kubelet``).

Rules, in any order and at any phase: start, succeed or fail a pod (retryable, permanent, preempted, a device
fault, Megatron's 16 and 17, in-place restarts exhausted, a pod the kubelet refused before it ran), delete or evict
a pod of any attempt, lose a node (its heartbeat stops: the real controllers evict its pods) and bring it back,
cordon and uncordon, pause (SIGSTOP) and resume the operator, kill it (SIGKILL) and start it again, suspend and
resume the job, change runPolicy.backoffLimit.

After each step, once the operator is idle and nothing moves (``settle``), the invariants of docs/faults.md hold:
the job is finished, or suspended with the reason in its conditions, or its current attempt has every index (Pending
is fine): a missing pod is never a state a job rests in; no pod of an older attempt is pending or running; no pod
is left being deleted; a Failed job names a cause taken from a pod or a limit; restarts and disruptions equal what
the oracle (``fault_model``) computes from the faults injected; no finalizer is left on a pod of a finished job or,
at the end, of a deleted one.

``make test`` runs a short run (FAULT_SEQUENCES, default 12 sequences); ``make test-faults`` the long one, which
shrinks a failure to a minimal sequence. Each sequence found failing becomes a plain test (at the end of this file).
"""
from __future__ import annotations

import itertools
import json
import os
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test
from kubernetes import client

from fake_kubelet import LABEL, TOLERATION, FakeKubelet, FakeNodes, wait
from fault_model import Fault, JobModel, Success
from operator_process import Operator
from test_operator_train_job import GROUP, PLURAL, VERSION, free_port, operator_command, operator_env

pytestmark = pytest.mark.operator

FINALIZER = "ascendtrain.dev/pod-tracking"
SEQUENCES = int(os.environ.get("FAULT_SEQUENCES", "12"))
STEPS = int(os.environ.get("FAULT_SEQUENCE_STEPS", "12"))
NODES = [f"fault-node-{i}" for i in range(4)]
_names = itertools.count()
_RUN = {"sequences": 0, "longest": 0, "started": time.monotonic()}  # for the progress line of a long run
PICK = st.integers(0, 63)  # which of the candidate pods (or nodes) a rule acts on

# Each failure a pod can report: (exit code, termination message, what the oracle knows of it).
FAILURES = {
    "retryable": (137, None, {}),
    "permanent": (1, "Traceback (most recent call last):\nValueError: bad config value", {}),
    "preempted": (143, json.dumps({"status": "Failed", "reason": "Preempted", "iteration": 7,
                                   "checkpoint": "/ckpt/iter_0000007"}), {"reason": "Preempted"}),
    "device": (1, "RuntimeError: HCCL function error: HcclAllReduce, error code is 7", {"node_fault": True}),
    "rerun": (16, None, {}),
    "numeric": (17, None, {}),
    "in-place exhausted": (1, json.dumps({"status": "Failed", "reason": "InPlaceRecoveryExhausted",
                                          "message": "local rank 0 exit code 1 after 3 in-place restart(s)"}),
                           {"reason": "InPlaceRecoveryExhausted"}),
    "repeated": (1, json.dumps({"status": "Failed", "reason": "RepeatedFailure", "permanent": True,
                                "error": "AssertionError: First dimension of the tensor should be divisible",
                                "message": "AssertionError: First dimension of the tensor should be divisible "
                                           "(local rank 0, exit code 1): the same error as the failure before"}),
                 {"reason": "RepeatedFailure", "permanent_report": True}),
    "refused before running": (None, "Node didn't have enough resource: cpu", {}),
}


@pytest.fixture(scope="module")
def fault_cluster(control_plane, tmp_path_factory):
    """A namespace, the operator watching it, and the test's nodes, shared by every sequence of this module."""
    from kube_fixtures import _namespace_name
    from ascend_cluster.controlplane import write_kubeconfig
    from kubernetes import config

    namespace = _namespace_name("fault-sequences")
    control_plane.request("/api/v1/namespaces", "POST", {"metadata": {"name": namespace}})
    folder = tmp_path_factory.mktemp("fault-sequences")
    admin = control_plane.pki.issue("admin", "kubernetes-admin", ("system:masters",))
    kubeconfig = write_kubeconfig(folder / "kubeconfig", control_plane.server, control_plane.pki.ca.cert,
                                  "kubernetes-admin", admin, namespace)
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    api = client.ApiClient(configuration)
    wait(lambda: _exists(api, namespace), 30, "the namespace's default ServiceAccount")
    nodes = FakeNodes(api, NODES).start()
    log = open(folder / "operator.log", "w")
    health, metrics = free_port(), free_port()
    _python, _m, _module, *argv = operator_command(namespace, "--standalone", "--health", f"127.0.0.1:{health}")
    operator = Operator(operator_env(kubeconfig, ASCEND_OPERATOR_METRICS_PORT=str(metrics)), argv, health, metrics,
                        log)  # argv: what `python -m ascend_operator.main` is given
    operator.start()
    try:
        yield api, namespace, nodes, operator
    finally:
        operator.stop()
        log.close()
        nodes.stop()
        control_plane.request(f"/api/v1/namespaces/{namespace}", "DELETE")
        print((folder / "operator.log").read_text()[-3000:])


def _exists(api, namespace: str) -> bool:
    try:
        client.CoreV1Api(api).read_namespaced_service_account("default", namespace)
        return True
    except client.ApiException:
        return False


class FaultSequences(RuleBasedStateMachine):
    """One job per sequence; the cluster (nodes, operator) is the module's."""

    cluster = None  # set by the test before the machine runs

    @initialize(nnodes=st.integers(1, 3), backoff=st.integers(0, 3), clean=st.sampled_from(["All", "Running", "None"]))
    def create_job(self, nnodes, backoff, clean):
        self.api, self.namespace, self.nodes, self.operator = self.cluster
        self.core, self.custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        self.kubelet = FakeKubelet(self.api, self.namespace, self.nodes)
        for name in NODES:  # every sequence starts on healthy nodes and a running operator
            if name not in self.nodes.alive:
                self.nodes.restore(name)
            self.nodes.cordon(name, False)
        if not self.operator.up:
            self.operator.kill() if self.operator.running else None
            self.operator.start()
        wait(lambda: all(self.nodes.ready(n) for n in NODES), 60, "the test's nodes Ready")
        self.name = f"seq-{os.getpid()}-{next(_names)}"
        self.model = JobModel(nnodes, backoff)
        self.candidates = [self.model]
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AscendTrainJob", "metadata": {"name": self.name},
                "spec": {"image": "engine:test", "nnodes": nnodes, "nprocPerNode": 1,
                         "nodeSelector": {LABEL: "true"}, "tolerations": [TOLERATION],
                         "terminationGracePeriodSeconds": 30,
                         "train": {"training": {"globalBatchSize": 6}, "observability": {"metricsPort": 0}},
                         "runPolicy": {"backoffLimit": backoff, "cleanPodPolicy": clean}}}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        self.selector = f"ascendtrain.dev/job-name={self.name}"
        self.steps = [f"create {self.name}: nnodes {nnodes}, backoffLimit {backoff}, cleanPodPolicy {clean}"]
        self.settle()

    # -- reading the cluster --------------------------------------------------------------------------------------

    def job(self) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)

    def pods(self) -> list[dict]:
        return self.kubelet.pods(self.selector)

    def live(self, *phases: str) -> list[dict]:
        return [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")
                and (not phases or (p.get("status") or {}).get("phase") in phases)]

    @staticmethod
    def attempt(pod: dict) -> int:
        return int(pod["metadata"]["labels"]["ascendtrain.dev/attempt"])

    @staticmethod
    def index(pod: dict) -> int:
        return int(pod["metadata"]["labels"]["ascendtrain.dev/replica-index"])

    def settle(self, quiet_s: float = 0.4, timeout: float = 90.0) -> None:
        """Until the operator (when up) has nothing queued and neither the job nor its pods change for ``quiet_s``;
        meanwhile the kubelet finishes the deletions on its live nodes. Then the oracle takes the operator's
        decision, when it could make one."""
        deadline, last, since = time.monotonic() + timeout, None, None
        while True:
            pods = self.pods()
            if self.kubelet.finish_deletions(self.selector, pods):
                pods = self.pods()
            job = self.job()
            state = (job["metadata"]["resourceVersion"],
                     tuple((p["metadata"]["name"], p["metadata"]["resourceVersion"]) for p in pods),
                     tuple((p["metadata"]["name"], (p.get("spec") or {}).get("nodeName")) for p in pods))
            # pods on a node that went silent are evicted by the controllers a few seconds later (their toleration):
            # not quiet until they are gone
            stranded = [name for name, node in state[2] if node and node not in self.nodes.alive]
            if state == last and not stranded and (not self.operator.up or self.operator.idle()):
                since = since or time.monotonic()
                if time.monotonic() - since >= quiet_s:
                    break
            else:
                since = None
            last = state
            if time.monotonic() > deadline:
                raise AssertionError(f"no quiescence after {timeout}s: {job.get('status')}")
            time.sleep(0.1)
        if self.operator.up:  # what it may have decided, for the invariant to hold the status to
            self.candidates = self.model.outcomes()

    # -- the kubelet's rules --------------------------------------------------------------------------------------

    @staticmethod
    def _pick(pick: int, pods: list[dict]) -> dict:
        """The ``pick``-th of ``pods`` (by name, modulo): every rule draws the same whatever the cluster holds, so
        Hypothesis can replay and shrink a sequence."""
        return sorted(pods, key=lambda p: p["metadata"]["name"])[pick % len(pods)]

    @rule(pick=PICK)
    def start_pod(self, pick):
        pods = [p for p in self.live("Pending") if self.kubelet.reports(p)]
        if pods:
            pod = self._pick(pick, pods)
            self.say(f"start {pod['metadata']['name']}")
            self.kubelet.start(pod)
            self.settle()

    @rule(pick=PICK)
    def succeed_pod(self, pick):
        pods = [p for p in self.live("Running") if self.kubelet.reports(p)]
        if pods:
            pod = self._pick(pick, pods)
            self.say(f"succeed {pod['metadata']['name']}")
            self.kubelet.end(pod, 0)
            self.model.fault(self.attempt(pod), Success(self.index(pod)))
            self.settle()

    @rule(pick=PICK, kind=st.sampled_from(sorted(FAILURES)))
    def fail_pod(self, pick, kind):
        code, message, known = FAILURES[kind]
        phases = ("Pending",) if code is None else ("Running",)
        pods = [p for p in self.live(*phases) if self.kubelet.reports(p)]
        if not pods:
            return
        pod = self._pick(pick, pods)
        self.say(f"fail {pod['metadata']['name']} ({kind})")
        if code is None:
            self.kubelet.end(pod, None, message, reason="OutOfcpu")
            cause = "failed without an exit code"
        else:
            self.kubelet.end(pod, code, message)
            cause = f"exit code {code}"
        self.model.fault(self.attempt(pod), Fault(pod["metadata"]["name"], failed=True, ran=code is not None,
                                                  exit_code=code, cause=cause, **known))
        self.settle()

    @rule(pick=PICK, evict=st.booleans())
    def delete_pod(self, pick, evict):
        """A user's delete, or a drain's eviction (the API server's own DisruptionTarget) of a pod of any attempt."""
        pods = self.live("Pending", "Running")
        if not pods:
            return
        pod = self._pick(pick, pods)
        ran = pod["status"].get("phase") == "Running"
        name = pod["metadata"]["name"]
        self.say(f"{'evict' if evict else 'delete'} {name} ({pod['status'].get('phase')})")
        if evict:
            self.core.create_namespaced_pod_eviction(name, self.namespace, {"metadata": {"name": name,
                                                                                         "namespace": self.namespace}})
        else:
            self.core.delete_namespaced_pod(name, self.namespace)
        self.model.fault(self.attempt(pod), Fault(name, failed=False, ran=ran, disrupted=evict,
                                                  cause="was deleted while running"))
        self.settle()

    @rule(pick=PICK)
    def lose_node(self, pick):
        """A node's kubelet goes silent: kube-controller-manager marks it NotReady and evicts its pods."""
        bound = [p for p in self.live() if self.kubelet.reports(p)]
        if not bound or len(self.nodes.alive) < 2:
            return
        nodes = sorted({p["spec"]["nodeName"] for p in bound})
        node = nodes[pick % len(nodes)]
        self.say(f"lose {node}")
        self.nodes.lose(node)
        # once the node lifecycle controller has tainted it, nothing more is placed there: what is bound to it now
        # is what its taint eviction takes
        wait(lambda: not self.nodes.ready(node), 60, f"{node} NotReady")
        on_node = [p for p in self.live() if (p.get("spec") or {}).get("nodeName") == node]
        wait(lambda: all(self._evicted(p) for p in on_node), 60, f"the pods on {node} evicted")
        for pod in on_node:
            phase = pod["status"].get("phase")
            if phase in ("Pending", "Running"):
                self.model.fault(self.attempt(pod), Fault(pod["metadata"]["name"], failed=False,
                                                          ran=phase == "Running", node_fault=True))
        self.settle()

    def _evicted(self, pod: dict) -> bool:
        try:
            now = self.core.read_namespaced_pod(pod["metadata"]["name"], self.namespace)
        except client.ApiException:
            return True
        return now.metadata.uid != pod["metadata"]["uid"] or now.metadata.deletion_timestamp is not None

    @rule(node=st.sampled_from(NODES))
    def restore_node(self, node):
        if node not in self.nodes.alive:
            self.say(f"restore {node}")
            self.nodes.restore(node)
            self.settle()

    @rule(node=st.sampled_from(NODES), on=st.booleans())
    def cordon(self, node, on):
        self.say(f"{'cordon' if on else 'uncordon'} {node}")
        self.nodes.cordon(node, on)
        self.settle()

    # -- the operator's and the user's rules ----------------------------------------------------------------------

    @precondition(lambda self: self.operator.running)
    @rule(on=st.booleans())
    def pause_operator(self, on):
        self.say("pause the operator" if on else "resume the operator")
        self.operator.pause(on)
        self.settle()

    @rule()
    def kill_and_start_operator(self):
        if self.operator.running:
            self.say("kill the operator")
            self.operator.kill()
        else:
            self.say("start the operator")
            self.operator.start()
        self.settle()

    @precondition(lambda self: self.operator.up)  # the job's and the pods' events come on separate watches
    @rule(suspend=st.booleans())
    def set_suspend(self, suspend):
        self.say(f"suspend: {suspend}")
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name,
                                                   {"spec": {"runPolicy": {"suspend": suspend}}})
        self.model.suspend = suspend
        self.settle()

    @precondition(lambda self: self.operator.up)
    @rule(limit=st.integers(0, 3))
    def set_backoff_limit(self, limit):
        self.say(f"backoffLimit: {limit}")
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name,
                                                   {"spec": {"runPolicy": {"backoffLimit": limit}}})
        self.model.backoff_limit = limit
        self.settle()

    # -- the invariants -------------------------------------------------------------------------------------------

    def say(self, step: str) -> None:
        """The sequence so far, for the failure's message (a replay on a live cluster may not reproduce it)."""
        self.steps.append(step)

    @invariant()
    def converged(self):
        if not getattr(self, "model", None) or not self.operator.up:
            return  # a paused or stopped operator decides nothing: nothing to hold it to yet
        try:
            self._check()
        except AssertionError as e:
            raise AssertionError(f"{e}\nafter:\n  " + "\n  ".join(self.steps)) from None

    def _check(self) -> None:
        status = self.job().get("status") or {}
        pods = self.pods()
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        phase = status.get("phase")
        seen = (status.get("restarts", 0), status.get("disruptions", 0),
                phase if phase in ("Succeeded", "Failed", "Suspended") else "Active")
        matching = [m for m in self.candidates if (m.restarts, m.disruptions, m.phase) == seen]
        assert matching, f"status {seen} is none of the oracle's {[(m.restarts, m.disruptions, m.phase) for m in self.candidates]}: {status}"
        self.model = model = matching[0]
        self.candidates = [model]
        assert not [p["metadata"]["name"] for p in pods if p["metadata"].get("deletionTimestamp")], \
            f"pods left being deleted: {status}"
        if model.terminal:
            assert phase == model.phase, (status, model)
            assert not [p for p in pods if FINALIZER in (p["metadata"].get("finalizers") or [])], \
                "finalizers left on a finished job's pods"
            if phase == "Failed":
                message = conditions["Failed"]["message"]
                assert any(cause in message for cause in model.causes), (message, model.causes)
            return
        assert phase not in ("Succeeded", "Failed"), (status, model)
        current = model.attempt
        older = [p for p in pods if self.attempt(p) < current and p["status"].get("phase") in ("Pending", "Running")]
        assert not older, f"pods of an older attempt still pending or running: {older}"
        if model.phase == "Suspended":
            assert phase == "Suspended" and conditions["Suspended"]["status"] == "True", status
            assert not [p for p in pods if self.attempt(p) == current], "a suspended job keeps pods"
            return
        indexes = {self.index(p) for p in pods if self.attempt(p) == current}
        assert indexes == set(range(model.nnodes)), f"attempt {current} has pods {sorted(indexes)}: {status}"
        assert phase in ("Pending", "Running", "Restarting"), status

    def teardown(self):
        if not getattr(self, "model", None):
            return
        if self.operator.running and self.operator.paused:
            self.operator.pause(False)
        if not self.operator.running:
            self.operator.start()
        for name in NODES:
            if name not in self.nodes.alive:
                self.nodes.restore(name)
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)

        def gone() -> bool:
            self.kubelet.finish_deletions(self.selector)
            return not self.pods()
        wait(gone, 120, "a deleted job's pods gone (no finalizer left on them)", interval=0.2)
        _RUN["sequences"] += 1
        _RUN["longest"] = max(_RUN["longest"], len(self.steps) - 1)
        print(f"sequence {_RUN['sequences']}/{SEQUENCES}: {len(self.steps) - 1} steps, ended "
              f"{self.model.phase} (restarts {self.model.restarts}, disruptions {self.model.disruptions}); longest "
              f"{_RUN['longest']} steps; {time.monotonic() - _RUN['started']:.0f} s so far", flush=True)


def test_fault_sequences_keep_the_invariants(fault_cluster):
    FaultSequences.cluster = fault_cluster
    run_state_machine_as_test(FaultSequences, settings=settings(
        max_examples=SEQUENCES, stateful_step_count=STEPS, deadline=None, derandomize=False,
        suppress_health_check=list(HealthCheck), report_multiple_bugs=False, database=None))
