"""Kubernetes' protobuf wire format for built-in kinds, as kube-apiserver reads and writes it.

client-go (so kubectl's typed requests: ``create namespace``, ``create configmap``, ``drain``'s evictions and
deletes) sends ``application/vnd.kubernetes.protobuf`` bodies: the magic ``k8s\\x00`` and a ``runtime.Unknown``
message whose ``typeMeta`` names the kind and whose ``raw`` is the object's message from k8s.io/api.

The message layouts are Kubernetes' own ``generated.proto`` files of the emulated release, kept verbatim under
``protos/`` (k8s.io/api core, policy, coordination and events v1; apimachinery meta/v1, runtime, resource,
intstr), compiled with ``grpc_tools.protoc`` the first time a protobuf body arrives. What is written by hand
is only the mapping of apimachinery's few custom JSON types (Time, MicroTime, Quantity, IntOrString,
RawExtension, FieldsV1) that have a protobuf shape different from their JSON one.

Differs from a real API server: Go decodes into structs, where an empty string and an absent one are the same
value; a dict cannot tell, so empty strings are dropped on decoding (a ``*string`` set to "" -- e.g.
``storageClassName: ""`` -- reads as unset). Zero numbers and ``false`` are kept.
"""
from __future__ import annotations

import base64
import datetime
import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
PROTO_ROOT = Path(__file__).with_name("protos")

_META = "k8s.io.apimachinery.pkg.apis.meta.v1"
# API group -> the proto package of its v1 kinds (the groups whose generated.proto is under protos/).
_PACKAGES = {"": "k8s.io.api.core.v1", "policy": "k8s.io.api.policy.v1",
             "coordination.k8s.io": "k8s.io.api.coordination.v1", "events.k8s.io": "k8s.io.api.events.v1",
             "scheduling.k8s.io": "k8s.io.api.scheduling.v1"}


class ProtobufError(ValueError):
    """A body that is not a Kubernetes protobuf envelope of a kind this server knows."""


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    files = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "k8s.pb"
        done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", "--include_imports",
                               f"--descriptor_set_out={out}", *files], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"protoc failed on {PROTO_ROOT}: {done.stderr}")
        descriptors = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for proto in descriptors.file:
        pool.Add(proto)
    return pool


def _message_class(full_name: str) -> type[Message]:
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


def _kind_message(api_version: str, kind: str) -> type[Message]:
    """The message of ``kind``; meta/v1 kinds (DeleteOptions, Status, ...) come under any group's version."""
    group, _, version = api_version.rpartition("/")
    names = [f"{_PACKAGES[group]}.{kind}"] if group in _PACKAGES and version == "v1" else []
    for name in [*names, f"{_META}.{kind}"]:
        try:
            return _message_class(name)
        except KeyError:
            continue
    raise ProtobufError(f"no protobuf message for {kind} of {api_version or 'v1'}")


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it stands for, ``apiVersion`` and ``kind`` included."""
    if not body.startswith(MAGIC):
        raise ProtobufError("the protobuf body does not start with the Kubernetes magic number")
    try:
        unknown = _message_class("k8s.io.apimachinery.pkg.runtime.Unknown").FromString(body[len(MAGIC):])
        api_version, kind = unknown.typeMeta.apiVersion, unknown.typeMeta.kind
        if unknown.contentEncoding:
            raise ProtobufError(f"content encoding {unknown.contentEncoding!r} is not supported")
        obj = _to_json(_kind_message(api_version, kind).FromString(unknown.raw))
    except DecodeError as exc:
        raise ProtobufError(f"the protobuf body cannot be decoded: {exc}") from None
    return {"apiVersion": api_version, "kind": kind, **obj}


def encode(obj: dict[str, Any]) -> bytes:
    """``obj`` (a built-in kind, its list, or a Status) as kube-apiserver writes it in protobuf."""
    api_version, kind = obj.get("apiVersion", "v1"), obj.get("kind", "")
    message = _from_json(_kind_message(api_version, kind), obj)
    unknown = _message_class("k8s.io.apimachinery.pkg.runtime.Unknown")()
    unknown.typeMeta.apiVersion, unknown.typeMeta.kind = api_version, kind
    unknown.raw = message.SerializeToString()
    return MAGIC + unknown.SerializeToString()


def encodable(api_version: str, kind: str) -> bool:
    try:
        _kind_message(api_version, kind)
    except ProtobufError:
        return False
    return True


# -- apimachinery's types whose JSON differs from their message --------------------------------------------------

def _time_to_json(message: Message, micro: bool) -> str | None:
    if not message.seconds and not message.nanos:
        return None  # the zero time: Go writes an empty message and reads it back as null
    at = datetime.datetime.fromtimestamp(message.seconds, datetime.timezone.utc)
    if micro:
        return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{message.nanos // 1000:06d}Z"
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _time_from_json(cls: type[Message], value: str) -> Message:
    at = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return cls(seconds=int(at.timestamp()), nanos=at.microsecond * 1000)


def _special_to_json(name: str, message: Message) -> Any:
    if name in (f"{_META}.Time", f"{_META}.MicroTime"):
        return _time_to_json(message, micro=name.endswith("MicroTime"))
    if name == "k8s.io.apimachinery.pkg.api.resource.Quantity":
        return message.string
    if name == "k8s.io.apimachinery.pkg.util.intstr.IntOrString":
        return message.strVal if message.type == 1 else message.intVal
    if name == "k8s.io.apimachinery.pkg.runtime.RawExtension":
        return json.loads(message.raw) if message.raw else None
    if name == f"{_META}.FieldsV1":
        return json.loads(message.Raw) if message.Raw else {}
    return _NOT_SPECIAL


def _special_from_json(cls: type[Message], value: Any) -> Any:
    name = cls.DESCRIPTOR.full_name
    if name in (f"{_META}.Time", f"{_META}.MicroTime"):
        return _time_from_json(cls, value)
    if name == "k8s.io.apimachinery.pkg.api.resource.Quantity":
        return cls(string=str(value))
    if name == "k8s.io.apimachinery.pkg.util.intstr.IntOrString":
        return cls(type=1, strVal=value) if isinstance(value, str) else cls(type=0, intVal=value)
    if name == "k8s.io.apimachinery.pkg.runtime.RawExtension":
        return cls(raw=json.dumps(value).encode())
    if name == f"{_META}.FieldsV1":
        return cls(Raw=json.dumps(value).encode())
    return _NOT_SPECIAL


_NOT_SPECIAL = object()

# Go structs embedded with `json:",inline"`: their fields appear in the outer object's JSON. These are all such
# fields of the kinds under protos/ (grep 'json:",inline"' in k8s.io/api's types.go, TypeMeta and ListMeta aside,
# which protobuf leaves out).
_INLINE = frozenset({"volumeSource", "persistentVolumeSource", "localObjectReference", "handler",
                     "ephemeralContainerCommon"})


def _inline(field: FieldDescriptor) -> bool:
    return field.name in _INLINE and field.message_type is not None


# -- the generic walk -----------------------------------------------------------------------------------------------

def _value_to_json(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        special = _special_to_json(field.message_type.full_name, value)
        return _to_json(value) if special is _NOT_SPECIAL else special
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode()
    return value


def _to_json(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value_to_json(value_field, v) for k, v in value.items()}
        elif field.is_repeated:
            out[field.name] = [_value_to_json(field, v) for v in value]
        elif _inline(field):
            out.update(_to_json(value))
        else:
            converted = _value_to_json(field, value)
            if converted is not None and converted != "":
                out[field.name] = converted
    return out


def _value_from_json(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64decode(value)
    return value


def _fill(message: Message, value: Any, field: FieldDescriptor) -> None:
    """Sets one message-typed field (singular) from its JSON value."""
    cls = message_factory.GetMessageClass(field.message_type)
    special = _special_from_json(cls, value)
    getattr(message, field.name).CopyFrom(_from_json(cls, value) if special is _NOT_SPECIAL else special)


def _from_json(cls: type[Message], obj: dict[str, Any]) -> Message:
    message = cls()
    descriptor: Descriptor = cls.DESCRIPTOR
    for field in filter(_inline, descriptor.fields):
        inner = {k: v for k, v in obj.items() if k in field.message_type.fields_by_name}
        if inner:
            getattr(message, field.name).CopyFrom(_from_json(message_factory.GetMessageClass(field.message_type),
                                                             inner))
    for key, value in obj.items():
        field = descriptor.fields_by_name.get(key)
        if field is None or value is None:
            continue  # apiVersion/kind live in the envelope; a null is an unset field
        target = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for k, v in value.items():
                if value_field.message_type is None:
                    target[k] = _value_from_json(value_field, v)
                else:
                    item_cls = message_factory.GetMessageClass(value_field.message_type)
                    special = _special_from_json(item_cls, v)
                    target[k].CopyFrom(_from_json(item_cls, v) if special is _NOT_SPECIAL else special)
        elif field.is_repeated:
            for item in value:
                if field.message_type is None:
                    target.append(_value_from_json(field, item))
                else:
                    item_cls = message_factory.GetMessageClass(field.message_type)
                    special = _special_from_json(item_cls, item)
                    target.add().CopyFrom(_from_json(item_cls, item) if special is _NOT_SPECIAL else special)
        elif field.message_type is not None:
            _fill(message, value, field)
        else:
            setattr(message, field.name, _value_from_json(field, value))
    return message


def only_protobuf(accept: str) -> bool:
    """Whether an Accept header leaves the server no JSON answer.

    Differs from a real API server: kube-apiserver answers in the client's first acceptable type, so client-go's
    ``application/vnd.kubernetes.protobuf, application/json`` gets protobuf; here any client that accepts JSON
    gets JSON (which that header allows), and protobuf goes only to one that accepts nothing else.
    """
    types = [part.split(";", 1)[0].strip().lower() for part in accept.split(",") if part.strip()]
    return MEDIA_TYPE in types and not any(t in ("application/json", "application/*", "*/*", "application/yaml")
                                           for t in types)
