"""``ascend-train``: run the embedded local cluster and talk to it.

    ascend-train local up [--fresh]            control plane + node agent + operator in the foreground (Ctrl-C stops)
    ascend-train local up --nodes 3 --devices-per-node 8   three nodes with 8 huawei.com/Ascend910 each
    ascend-train local up --kueue              with Kueue's manager too (queues, quotas, preemption)
    ascend-train local up --nodes 4 --topology blocks=1,racks=2   nodes labelled by block and rack
    ascend-train local down                    stop the `local up` running on --root (from another shell)
    ascend-train local node lose|add NAME      a node's machine dies (its pods' processes too) or (re)joins
    ascend-train local node cordon|uncordon NAME   mark a node (un)schedulable, as `kubectl cordon` does
    ascend-train local demo --file FILE        up, apply FILE, follow the jobs to the end, exit 0 if all succeeded
    ascend-train apply -f FILE [--dry-run]     create or update every document of FILE (--dry-run: validate only)
    ascend-train validate -f FILE              check FILE offline: every error, as file:line: field: message
    ascend-train plan -f FILE                  each job's memory estimate per pipeline stage against its device
    ascend-train get KIND [NAME]               a table (CRD printer columns) or one object as YAML
    ascend-train delete KIND NAME              delete one object
    ascend-train logs POD [-f]                 the pod's container output (-f: follow it until the pod ends)
                                               (POD <job>-<index>: that replica's newest attempt)
    ascend-train dashboard [--port 8765]       a web page of the jobs: progress, ETA, loss/lr/tok/s curves
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import uuid

import urllib3
import yaml

from ascend_engine.cli_text import plain, quiet_broken_pipe

from ascend_cluster import lifecycle
from ascend_cluster import topology as topology_labels
from ascend_cluster.cluster import NODE_REQUESTS, LocalCluster
from ascend_cluster.pod_environment import ContainerPathView
from ascend_cluster.pod_logs import FollowedLog, read_container_log
from ascend_cluster.resource_client import ApiRequestError, ApiResource, ResourceClient
from ascend_cluster.runner import pod_log_path
from ascend_operator.api.group import LABEL_JOB_NAME, LABEL_REPLICA_INDEX

from .printing import table

TERMINAL_PHASES = ("Succeeded", "Failed")
HEARTBEAT_S = 4.0  # `local demo` never stays silent longer than this while it waits


class UsageError(Exception):
    """An expected problem, printed as one line without a traceback."""


def _read_manifest(file: str) -> str:
    """A manifest file's text, or stdin's for ``-``."""
    try:
        return sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {file}: {exc.strerror}") from None


def _load_documents(path: str) -> list[dict[str, Any]]:
    text = _read_manifest(path)
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not valid YAML: {exc}") from None
    for index, doc in enumerate(docs):
        if not isinstance(doc, dict) or not doc.get("kind") or not (doc.get("metadata") or {}).get("name"):
            raise UsageError(f"{path}: document {index + 1} needs kind and metadata.name")
    return docs


def _client(root: str) -> ResourceClient:
    kubeconfig = Path(root) / "kubeconfig"
    if not kubeconfig.exists():
        raise UsageError(f"no local cluster under {root}/ (start one with `ascend-train local up`)")
    return ResourceClient(kubeconfig)


def _is_custom(r: ApiResource) -> bool:
    return bool(r.group) and not r.group.endswith("k8s.io")


# What a server writes into an object's metadata (`kubectl get -o yaml` prints it): kube-apiserver refuses a create
# that carries a resourceVersion (500), so an object read back from a cluster could not be applied again.
SERVER_SET_METADATA = ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields", "selfLink")


def _memory_refusals(docs: list[dict[str, Any]]) -> list[str]:
    """The AscendTrainJobs whose layout cannot fit their device's memory, with the figures (docs/plan.md); a spec
    the model refuses is left to the server, which names its field."""
    from pydantic import ValidationError

    from ascend_operator.kinds import plan
    from ascend_operator.api.train_job import AscendTrainJobSpec

    refused = []
    for doc in docs:
        if doc.get("kind") != "AscendTrainJob" or not isinstance(doc.get("spec"), dict):
            continue
        try:
            spec = AscendTrainJobSpec.model_validate(doc["spec"])
        except ValidationError:
            continue
        why = plan.refusal(plan.job_plan(spec))
        if why:
            refused.append(f"ascendtrainjob/{doc['metadata']['name']}: {plan.REFUSED}: {why}")
    return refused


def apply_file(resources: ResourceClient, path: str, namespace: str,
               field_validation: str = "Strict") -> list[tuple[ApiResource, dict[str, Any]]]:
    applied = []
    docs = _load_documents(path)
    refused = _memory_refusals(docs)
    if refused:  # nothing of the file is applied, as kubectl applies nothing of a file the server refuses
        raise UsageError("\n".join(refused))
    for doc in docs:
        doc = {**doc, "metadata": {k: v for k, v in doc["metadata"].items() if k not in SERVER_SET_METADATA}}
        obj, action = resources.apply(doc, namespace, field_validation)
        r = resources.for_object(doc)
        print(f"{r.kind.lower()}.{r.group or 'core'}/{obj['metadata']['name']} {action}")
        applied.append((r, obj))
    return applied


def _tables(resources: ResourceClient, jobs: list[tuple[ApiResource, dict[str, Any]]],
            with_age: bool = True) -> tuple[str, list[dict[str, Any]]]:
    by_type: dict[ApiResource, list[dict[str, Any]]] = {}
    current = []
    for r, obj in jobs:
        meta = obj["metadata"]
        try:
            latest = resources.get(r, meta["name"], meta.get("namespace"))
        except ApiRequestError as exc:
            if exc.status != 404:
                raise
            latest = {**obj, "status": {"phase": "Failed", "message": "deleted"}}
        by_type.setdefault(r, []).append(latest)
        current.append(latest)
    blocks = []
    for r, objects in by_type.items():
        columns = resources.printer_columns(r)
        if not with_age:
            columns = [c for c in columns if c.get("type") != "date"]
        blocks.append(table(objects, columns, age_column=with_age))
    return "\n\n".join(blocks), current


def _latest_log_line(root: Path, pod: dict[str, Any]) -> str:
    """The last line a pod printed (rank 0's start-up lines: ``[train]  19.1s building the model ...``)."""
    meta = pod["metadata"]
    text = read_container_log(pod_log_path(root, meta["namespace"], meta["name"])).decode(errors="replace")
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def _heartbeat(resources: ResourceClient, current: list[dict[str, Any]], root: Path) -> str:
    """One line of what is happening now: each job's phase, progress and latest condition, and its pods; before
    the first iteration, what the first pod (rank 0) last printed."""
    pods = resources.list(resources.resolve("pods"), None)
    parts = []
    for obj in current:
        status, name = obj.get("status") or {}, obj["metadata"]["name"]
        progress = status.get("progress") or {}
        what = f"{name} {status.get('phase', 'Pending')}"
        if progress.get("iteration") is not None and progress.get("trainIters"):
            what += f" {progress['iteration']}/{progress['trainIters']}"
        latest = max(status.get("conditions") or [{}], key=lambda c: c.get("lastTransitionTime") or "")
        if latest.get("message") and not progress.get("iteration"):
            what += f" ({latest['message'][:80]})"
        mine = [p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_JOB_NAME) == name]
        if mine:
            what += "; pods " + ", ".join(f"{p['metadata']['name']} {(p.get('status') or {}).get('phase', 'Pending')}"
                                          for p in mine)
            first = min(mine, key=lambda p: int((p["metadata"].get("labels") or {}).get(LABEL_REPLICA_INDEX, 0)))
            if not progress.get("iteration") and (first.get("status") or {}).get("phase") == "Running" and \
                    (line := _latest_log_line(root, first)):
                what += f"; {first['metadata']['name']}: {line[:120]}"
        elif not status.get("conditions"):
            what += " (the operator has not picked it up yet)"
        parts.append(what)
    return "; ".join(parts) or "waiting for the operator"


def demo(args: argparse.Namespace) -> int:
    _load_documents(args.file)  # a bad file fails before anything starts
    running = lifecycle.running_pid(Path(args.root))
    if running is not None:
        raise UsageError(f"a local cluster already runs on {args.root}/ (pid {running}); apply the file to it "
                         f"with `ascend-train apply -f {args.file}`, or stop it with `ascend-train local down`")
    started = time.monotonic()
    print(f"starting the local cluster in {args.root}/: control plane (etcd, kube-apiserver, controllers, "
          "scheduler), CRDs, node agent, operator ...", flush=True)
    with LocalCluster(args.root, operator=True, fresh=args.fresh, **_nodes(args)) as cluster, \
            lifecycle.pid_file(cluster.root):
        print(f"local cluster up: kubeconfig {cluster.kubeconfig} (export KUBECONFIG={cluster.kubeconfig} "
              f"to use kubectl), operator log {cluster.operator_log}")
        resources = cluster.client()
        try:
            applied = apply_file(resources, args.file, args.namespace)
            jobs = [(r, obj) for r, obj in applied if _is_custom(r)]
            if not jobs:
                raise UsageError(f"{args.file} holds no custom resources to follow")
            # A job that had finished before this demo (kept from an earlier one) is not run again: say so.
            previous = [obj for _, obj in jobs if (obj.get("status") or {}).get("phase") in TERMINAL_PHASES]
            if len(previous) == len(jobs):
                print(f"{', '.join(o['metadata']['name'] for o in previous)} finished in an earlier demo (kept in "
                      f"{cluster.root}/): showing that run; `ascend-train local demo --fresh -f {args.file}` runs it "
                      "again", flush=True)
            last_key, current, said = None, [], time.monotonic()
            deadline = started + args.timeout
            while True:
                key, _ = _tables(resources, jobs, with_age=False)
                text, current = _tables(resources, jobs)
                if key != last_key:
                    print(f"\n[{time.monotonic() - started:6.1f}s]\n{text}", flush=True)
                    last_key, said = key, time.monotonic()
                elif time.monotonic() - said >= HEARTBEAT_S:
                    print(f"[{time.monotonic() - started:6.1f}s] {_heartbeat(resources, current, cluster.root)}",
                          flush=True)
                    said = time.monotonic()
                if all((o.get("status") or {}).get("phase") in TERMINAL_PHASES for o in current):
                    break
                if cluster.operator is not None and cluster.operator.poll() is not None:
                    tail = cluster.operator_log.read_text(errors="replace")[-3000:]
                    raise UsageError(f"the operator exited with code {cluster.operator.returncode}; "
                                     f"last lines of {cluster.operator_log}:\n{tail}")
                if time.monotonic() > deadline:
                    raise UsageError(f"timed out after {args.timeout:.0f}s; jobs: " + ", ".join(
                        f"{o['metadata']['name']}={(o.get('status') or {}).get('phase', 'Pending')}" for o in current))
                # a poll a second, and never past the next heartbeat (a loaded host makes a round slow)
                time.sleep(max(0.0, min(1.0, said + HEARTBEAT_S - time.monotonic())))
        finally:
            resources.close()
        succeeded = [o for o in current if o["status"]["phase"] == "Succeeded"]
        for obj in current:
            print(f"\n--- {obj['kind']} {obj['metadata']['name']} status\n"
                  + yaml.safe_dump(obj.get("status"), sort_keys=False).rstrip())
        if len(previous) == len(jobs):
            finished = max((o["status"].get("completionTime") or "?") for o in current)
            print(f"\n{len(succeeded)}/{len(current)} succeeded in the earlier run (finished {finished}); nothing "
                  f"was run now (logs under {cluster.root}/pods)")
        else:
            print(f"\n{len(succeeded)}/{len(current)} succeeded in {time.monotonic() - started:.0f}s "
                  f"(logs under {cluster.root}/pods, operator log {cluster.operator_log})")
        if len(succeeded) < len(current):
            print(f"objects and files are kept in {cluster.root}/; `ascend-train local demo --fresh -f {args.file}` "
                  "starts over")
        return 0 if len(succeeded) == len(current) else 1


def up(args: argparse.Namespace) -> int:
    running = lifecycle.running_pid(Path(args.root))
    if running is not None:
        raise UsageError(f"a local cluster already runs on {args.root}/ (pid {running}); "
                         "`ascend-train local down` stops it")
    stop: list[int] = []
    # SIGINT too: a backgrounded `local up &` starts with SIGINT ignored, so Python's Ctrl-C handling is off.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    with LocalCluster(args.root, operator=not args.no_operator, fresh=args.fresh,
                      **_nodes(args)) as cluster, lifecycle.pid_file(cluster.root):
        print(f"local cluster up at {cluster.control_plane.server} ({'fresh' if args.fresh else 'state kept'} "
              f"in {cluster.root}/), nodes: {', '.join(cluster.runners)}\n"
              f"  kubeconfig: {cluster.kubeconfig}\n"
              f"  try:        export KUBECONFIG={cluster.kubeconfig}; {cluster.kubectl} get atj,pods\n"
              f"  or:         ascend-train apply -f examples/quickstart.yaml; ascend-train get atj\n"
              f"Ctrl-C or `ascend-train local down` stops it; `local up --fresh` starts over.", flush=True)
        while not stop:
            if cluster.operator is not None and cluster.operator.poll() is not None:
                raise UsageError(f"the operator exited with code {cluster.operator.returncode}; "
                                 f"see {cluster.operator_log}")
            cluster.serve_node_requests()
            time.sleep(0.2)
        print("stopping the local cluster (objects and files are kept)", flush=True)
    return 0


def down(args: argparse.Namespace) -> int:
    pid = lifecycle.stop(Path(args.root))
    if pid is None:
        raise UsageError(f"no local cluster runs on {args.root}/")
    print(f"stopped the local cluster on {args.root}/ (pid {pid})")
    return 0


def validate(args: argparse.Namespace) -> int:
    """Offline: the CRD schemas (with CEL rules) and the spec models, every problem of every document at once."""
    from ascend_operator.validation import validate_text

    text = _read_manifest(args.file)
    docs, problems = validate_text(text, args.file)
    for problem in sorted(problems, key=lambda p: (p.line or 0, p.field)):
        print(problem, file=sys.stderr)
    if problems:
        print(f"{args.file}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    for doc in docs:
        suffix = " (dry run)" if getattr(args, "dry_run", False) else ""
        print(f"{str(doc['kind']).lower()}/{doc['metadata']['name']} valid{suffix}")
        if doc.get("kind") == "AscendTrainJob":
            _warn_near_memory(doc)
    return 0


def _warn_near_memory(doc: dict[str, Any]) -> None:
    """A printed warning for a job whose largest stage is over 90% of its device's memory (docs/plan.md)."""
    from ascend_operator.kinds import plan
    from ascend_operator.api.train_job import AscendTrainJobSpec

    near = plan.warning(plan.job_plan(AscendTrainJobSpec.model_validate(doc["spec"])))
    if near:
        print(f"warning: ascendtrainjob/{doc['metadata']['name']}: {plan.NEAR}: {near}", file=sys.stderr)


def plan(args: argparse.Namespace) -> int:
    """Each AscendTrainJob's per-device memory estimate per pipeline stage, against its device's memory."""
    from ascend_engine.plan.memory import table
    from ascend_operator.kinds import plan as job_plan
    from ascend_operator.api.train_job import AscendTrainJobSpec
    from ascend_operator.validation import validate_text

    text = _read_manifest(args.file)
    docs, problems = validate_text(text, args.file)
    problems = [p for p in problems if not p.message.startswith(job_plan.REFUSED)]  # shown below with the table
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{args.file}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    code, shown = 0, 0
    for doc in docs:
        if doc.get("kind") != "AscendTrainJob" or not (doc.get("spec") or {}).get("train"):
            continue
        spec = AscendTrainJobSpec.model_validate(doc["spec"])
        estimate = job_plan.job_plan(spec)
        p, t = spec.train.parallel, spec.train.training
        dp = spec.world_size // (p.tensorModelParallelSize * p.pipelineModelParallelSize)
        print(f"{'' if not shown else chr(10)}ascendtrainjob/{doc['metadata']['name']}: {spec.nnodes} pod(s) x "
              f"{spec.nprocPerNode}, TP {p.tensorModelParallelSize} PP {p.pipelineModelParallelSize} DP {dp}"
              f"{f' EP {p.expertModelParallelSize}' if p.expertModelParallelSize > 1 else ''}, micro-batch "
              f"{t.microBatchSize} x {t.seqLength} tokens, {t.precision}, recompute "
              f"{t.recomputeGranularity or 'none'}, distributed optimizer "
              f"{'on' if p.useDistributedOptimizer else 'off'}; GiB per device:")
        print(table(estimate))
        for note in estimate.notes:
            print(f"note: {note}")
        refused, near = job_plan.refusal(estimate), job_plan.warning(estimate)
        if refused:
            print(f"refused ({job_plan.REFUSED}): {refused}")
            code = 1
        elif near:
            print(f"warning ({job_plan.NEAR}): {near}")
        else:
            print(f"{estimate.verdict}: {estimate.summary()}")
        shown += 1
    if not shown:
        print(f"{args.file}: no AscendTrainJob with train: nothing to plan")
    return code


def apply(args: argparse.Namespace) -> int:
    if args.dry_run:
        return validate(args)
    if args.file != "-":  # refused before a cluster is needed (apply_file checks again, for stdin too)
        refused = _memory_refusals(_load_documents(args.file))
        if refused:
            raise UsageError("\n".join(refused))
    resources = _client(args.root)
    try:
        apply_file(resources, args.file, args.namespace, args.validate.capitalize())
    finally:
        resources.close()
    return 0


def get(args: argparse.Namespace) -> int:
    resources = _client(args.root)
    try:
        r = resources.resolve(args.kind)
        namespace = None if args.all_namespaces or not r.namespaced else args.namespace
        if args.name:
            print(yaml.safe_dump(resources.get(r, args.name, namespace), sort_keys=False).rstrip())
            return 0
        objects = resources.list(r, namespace)
        if not objects:
            print(f"No resources found{f' in {namespace} namespace' if namespace else ''}.")
            return 0
        columns = resources.printer_columns(r)
        if r.kind == "Pod" and not columns:
            columns = [{"name": "Status", "jsonPath": ".status.phase"},
                       {"name": "Restarts", "jsonPath": ".status.containerStatuses[0].restartCount"},
                       {"name": "IP", "jsonPath": ".status.podIP"}]
        print(table(objects, columns, with_namespace=args.all_namespaces and r.namespaced))
        for obj in objects:  # why a job failed, without reading its status YAML or pod logs
            failed = next((c for c in (obj.get("status") or {}).get("conditions") or []
                           if c.get("type") == "Failed" and c.get("status") == "True"), None)
            if failed:
                print(f"{obj['metadata']['name']} failed: {failed.get('message') or failed.get('reason')}")
    finally:
        resources.close()
    return 0


def delete(args: argparse.Namespace) -> int:
    resources = _client(args.root)
    try:
        r = resources.resolve(args.kind)
        resources.delete(r, args.name, args.namespace if r.namespaced else None)
        print(f'{r.kind.lower()}.{r.group or "core"} "{args.name}" deleted')
    finally:
        resources.close()
    return 0


def _newest_attempt(pods_dir: Path, replica: str) -> str | None:
    """``<job>-<index>`` names the replica; its pods are ``<job>-<index>-<attempt>``: the newest one's name."""
    attempts = [(int(d.name.rsplit("-", 1)[1]), d.name) for d in pods_dir.glob(f"{replica}-*")
                if d.is_dir() and d.name.rsplit("-", 1)[1].isdigit() and d.name.rsplit("-", 1)[0] == replica]
    return max(attempts)[1] if attempts else None


def logs(args: argparse.Namespace) -> int:
    pods_dir = Path(args.root) / "pods" / args.namespace
    if not (pods_dir / args.pod).is_dir():
        args.pod = _newest_attempt(pods_dir, args.pod) or args.pod
    path = pods_dir / args.pod
    if not path.is_dir():
        raise UsageError(f'pod "{args.pod}" has no logs under {path.parent}/ (not started yet, or another namespace?)')
    if not args.follow:
        sys.stdout.write(read_container_log(pod_log_path(Path(args.root), args.namespace, args.pod))
                         .decode(errors="replace"))
        return 0
    return _follow_logs(args, pod_log_path(Path(args.root), args.namespace, args.pod))


def _follow_logs(args: argparse.Namespace, log: Path) -> int:
    """``kubectl logs -f``: what is there, then what is added, until the pod has ended (or Ctrl-C)."""
    resources = _client(args.root)
    pods = resources.resolve("pods")
    offset = 0
    followed = None  # made once the log exists: the runner records the pod's mounts before it starts the log
    try:
        while True:
            try:
                phase = (resources.get(pods, args.pod, args.namespace).get("status") or {}).get("phase")
            except ApiRequestError as exc:
                if exc.status != 404:
                    raise
                phase = "Deleted"
            if log.exists():
                followed = followed or FollowedLog(ContainerPathView.of_pod(log.parent))
                with log.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                offset += len(chunk)
                ended = phase in ("Succeeded", "Failed", "Deleted")
                shown = followed.feed(chunk) + (followed.flush() if ended or not chunk else b"")
                sys.stdout.write(shown.decode(errors="replace"))
                sys.stdout.flush()
            if phase in ("Succeeded", "Failed", "Deleted"):
                return 0
            time.sleep(0.5)
    finally:
        resources.close()


def dashboard(args: argparse.Namespace) -> int:
    """The operator's read-only dashboard, served here from the local cluster's API."""
    from kubernetes import client, config

    from ascend_operator.dashboard.server import serve

    kubeconfig = Path(args.root) / "kubeconfig"
    if not kubeconfig.exists():
        raise UsageError(f"no local cluster under {args.root}/ (start one with `ascend-train local up`)")
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    stop: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    with client.ApiClient(configuration) as api:
        try:
            server = serve(api, args.port, args.address)
        except OSError as exc:
            raise UsageError(f"cannot listen on {args.address}:{args.port}: {exc.strerror}") from None
        print(f"dashboard at http://{args.address}:{server.server_address[1]}/ (Ctrl-C stops it)", flush=True)
        while not stop:
            time.sleep(0.2)
        server.shutdown()
    return 0


def _capacity(devices: list[str]) -> dict[str, int]:
    capacity = {}
    for item in devices or []:
        name, _, count = item.partition("=")
        if not count.isdigit():
            raise UsageError(f"--device wants NAME=COUNT, e.g. huawei.com/Ascend910=8 (got {item!r})")
        capacity[name] = int(count)
    return capacity


def _nodes(args: argparse.Namespace) -> dict[str, Any]:
    """LocalCluster's node arguments from --nodes, --devices-per-node, --device-resource and --device."""
    if args.nodes < 1:
        raise UsageError(f"--nodes must be at least 1 (got {args.nodes})")
    capacity = _capacity(args.device)
    if args.devices_per_node:
        capacity[args.device_resource] = args.devices_per_node
    try:
        text = getattr(args, "topology", None)  # absent when not given (no "(default: None)" in the help)
        topology = topology_labels.parse(text) if text else None
        if topology:
            topology_labels.node_labels([str(i) for i in range(args.nodes)], *topology)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return {"nodes": args.nodes, "capacity": capacity, "kueue": args.kueue, "topology": topology}


def node(args: argparse.Namespace) -> int:
    """Cordon and uncordon are API calls (what kubectl does); a lost or added node is the `local up` process's
    to play: the request goes through a file under the root that it picks up within a moment."""
    if args.action in ("cordon", "uncordon"):
        resources = _client(args.root)
        try:
            nodes = resources.resolve("nodes")
            resources.request("PATCH", nodes.path(None, args.name), {"spec": {
                "unschedulable": True if args.action == "cordon" else None}}, content_type="application/merge-patch+json")
        finally:
            resources.close()
        print(f"node/{args.name} {args.action}ed")
        return 0
    if lifecycle.running_pid(Path(args.root)) is None:
        raise UsageError(f"no local cluster runs on {args.root}/ (start one with `ascend-train local up`)")
    folder = Path(args.root) / NODE_REQUESTS
    folder.mkdir(exist_ok=True)
    request = folder / f"{uuid.uuid4().hex}.json"
    request.with_suffix(".tmp").write_text(json.dumps({"action": args.action, "node": args.name}))
    request.with_suffix(".tmp").rename(request)
    done = request.with_suffix(".done")
    deadline = time.monotonic() + 60
    while not done.exists():
        if time.monotonic() > deadline:
            request.unlink(missing_ok=True)
            raise UsageError(f"the local cluster on {args.root}/ did not take the request within 60s")
        time.sleep(0.1)
    answer = done.read_text()
    done.unlink()
    if answer != "ok":
        raise UsageError(answer.strip("'\""))
    lost = "lost: its pods' processes are stopped (killed once their pods are gone); it posts no more status"
    print(f"node/{args.name} {lost if args.action == 'lose' else 'added'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    intro, commands_text = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(prog="ascend-train", description=plain(intro),
                                     epilog="commands:\n" + plain(commands_text),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=".local-cluster",
                        help="local cluster directory: kubeconfig, objects, pod logs, claims (default: %(default)s)")
    commands = parser.add_subparsers(dest="command", required=True)
    local = commands.add_parser("local", help="run the embedded local cluster").add_subparsers(
        dest="local_command", required=True)
    local.add_parser("down", help="stop the 'local up' running on --root").set_defaults(func=down)
    sub = local.add_parser("node", help="node faults: lose or add a node, cordon or uncordon it")
    sub.add_argument("action", choices=("lose", "add", "cordon", "uncordon"),
                     help="lose: the machine dies (Ready turns Unknown, its pods are evicted); add: a node (re)joins; "
                          "cordon/uncordon: no new pods / new pods again")
    sub.add_argument("name", help="the node's name (as kubectl get nodes lists it)")
    sub.set_defaults(func=node)
    for name, func, text in (("up", up, "run the control plane, node agents and operator until Ctrl-C"),
                             ("demo", demo, "up, apply a file and follow its jobs to the end")):
        sub = local.add_parser(name, help=text, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        sub.add_argument("--device", action="append", default=[], metavar="NAME=COUNT",
                         help="extended resources each local node offers, e.g. huawei.com/Ascend910=8")
        sub.add_argument("--nodes", type=int, default=1,
                         help="how many nodes (one: named 'local'; more: node-1, node-2, ...)")
        sub.add_argument("--devices-per-node", type=int, metavar="M",
                         default=0, help="devices each node offers, of --device-resource (0: none)")
        sub.add_argument("--device-resource", default="huawei.com/Ascend910",
                         help="the resource name of --devices-per-node (nvidia.com/gpu for GPUs)")
        sub.add_argument("--fresh", action="store_true",
                         help="wipe the cluster root first (objects, logs, checkpoints); by default all are kept")
        sub.add_argument("--kueue", action="store_true",
                         help="also run Kueue's manager, so jobs labelled kueue.x-k8s.io/queue-name are queued")
        sub.add_argument("--topology", metavar="blocks=B,racks=R", default=argparse.SUPPRESS,
                         help="label the nodes with a block and a rack (topology.ascendtrain.dev/block, /rack): "
                              "consecutive nodes share a rack, R racks a block; with --kueue also Kueue's Topology "
                              f"{topology_labels.TOPOLOGY_NAME}")
        sub.set_defaults(func=func)
        if name == "up":
            sub.add_argument("--no-operator", action="store_true", help="control plane and node agents only")
        else:
            sub.add_argument("--file", "-f", required=True, default=argparse.SUPPRESS,
                             help="YAML with one or more documents")
            sub.add_argument("--timeout", type=float, default=900.0, help="seconds")
            sub.add_argument("--namespace", "-n", default="default", help="namespace of documents without one")
    sub = commands.add_parser("apply", help="create or update every document of a file")
    sub.add_argument("-f", "--file", required=True, help="YAML with one or more documents ('-': stdin)")
    sub.add_argument("--dry-run", action="store_true",
                     help="validate offline (schemas, CEL rules, models) and change nothing; no cluster needed")
    sub.add_argument("--validate", choices=("strict", "warn", "ignore"), default="strict",
                     help="the server's fieldValidation for unknown fields, as kubectl's (default: %(default)s)")
    sub.set_defaults(func=apply)
    sub = commands.add_parser("validate", help="check a file offline: every error with file:line: field")
    sub.add_argument("-f", "--file", required=True, help="YAML with one or more documents ('-': stdin)")
    sub.set_defaults(func=validate)
    sub = commands.add_parser("plan", help="each job's memory estimate per pipeline stage against its device "
                                           "(offline; exit 1 when a layout cannot fit)")
    sub.add_argument("-f", "--file", required=True, help="YAML with one or more documents ('-': stdin)")
    sub.set_defaults(func=plan)
    sub = commands.add_parser("get", help="list a kind (printer columns) or show one object")
    sub.add_argument("kind", help="what to get: a kind, plural or short name (atj, dsp, ckc, pods, cm, ...)")
    sub.add_argument("name", nargs="?", help="one object's name: shown whole as YAML (default: a table of all)")
    sub.add_argument("-A", "--all-namespaces", action="store_true", help="list every namespace's objects")
    sub.set_defaults(func=get)
    sub = commands.add_parser("delete", help="delete one object")
    sub.add_argument("kind", help="the object's kind, plural or short name (atj, dsp, ckc, pods, ...)")
    sub.add_argument("name", help="the object's name")
    sub.set_defaults(func=delete)
    sub = commands.add_parser("logs", help="a pod's container output")
    sub.add_argument("pod", help="the pod's name, e.g. quickstart-0-1 (rank 0 of job quickstart, attempt 1), or "
                                 "quickstart-0 for rank 0's newest attempt")
    sub.add_argument("-f", "--follow", action="store_true",
                     help="keep printing what the pod writes until it has ended (Ctrl-C stops)")
    sub.set_defaults(func=logs)
    sub = commands.add_parser("dashboard", help="a web page of the jobs with progress and curves",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub.add_argument("--port", type=int, default=8765, help="port to listen on (0: any free port)")
    sub.add_argument("--address", default="127.0.0.1", help="address to listen on")
    sub.set_defaults(func=dashboard)
    for name in ("apply", "get", "delete", "logs"):
        commands.choices[name].add_argument("-n", "--namespace", default="default",
                                            help="namespace (default: %(default)s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, inside the handler below, not at exit
        return code
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except ApiRequestError as exc:
        print(f"Error from server: {exc.message}", file=sys.stderr)
    except urllib3.exceptions.MaxRetryError as exc:
        print(f"error: cannot reach the local cluster ({exc.reason}); is `ascend-train local up` running?",
              file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ascend-train get pods | head`: the reader has what it wanted
        return quiet_broken_pipe()
    return 1


if __name__ == "__main__":
    sys.exit(main())
