"""torchft's lighthouse protocol (``torchft.LighthouseService``: ``Quorum`` and ``Heartbeat``), the
messages the launcher's own lighthouse (run/lighthouse_server.py) speaks to torchft's Managers.

The message classes are built here from a ``FileDescriptorProto`` written in code rather than from a
generated ``*_pb2.py``: a generated file is tied to the protoc that wrote it (protobuf refuses one
from a newer major version), while this needs only the installed ``protobuf`` runtime. The names,
the package and every field number are torchft's ``proto/torchft.proto`` (torchft 0.2.0), the
contract with its Rust client (``torchft._torchft``): a field that differs is a message the
Managers misread. A field added there later and sent by a newer Manager is kept as an unknown field
of its ``QuorumMember`` and goes back to every Manager with the quorum, so it is not lost.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

PACKAGE = "torchft"
SERVICE = f"{PACKAGE}.LighthouseService"
QUORUM_METHOD = f"/{SERVICE}/Quorum"
HEARTBEAT_METHOD = f"/{SERVICE}/Heartbeat"

_F = descriptor_pb2.FieldDescriptorProto
#: message -> its fields (name, number, type, label, message type) as in torchft's proto.
_MESSAGES: dict[str, tuple[tuple[str, int, int, int, str | None], ...]] = {
    "QuorumMember": (
        ("replica_id", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("address", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("store_address", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("step", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("world_size", 5, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
        ("shrink_only", 6, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("commit_failures", 8, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("data", 7, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ),
    "Quorum": (
        ("quorum_id", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("participants", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".torchft.QuorumMember"),
        ("created", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Timestamp"),
    ),
    "LighthouseQuorumRequest": (("requester", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".torchft.QuorumMember"),),
    "LighthouseQuorumResponse": (("quorum", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".torchft.Quorum"),),
    "LighthouseHeartbeatRequest": (("replica_id", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),),
    "LighthouseHeartbeatResponse": (),
}


def _build() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="openclaw_launch/torchft_lighthouse.proto",
        package=PACKAGE,
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto"],
    )
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            added = message.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                added.type_name = type_name
    service = proto.service.add(name="LighthouseService")
    for method in ("Quorum", "Heartbeat"):
        request, response = f".{PACKAGE}.Lighthouse{method}Request", f".{PACKAGE}.Lighthouse{method}Response"
        service.method.add(name=method, input_type=request, output_type=response)
    file = pool.Add(proto)
    return {name: message_factory.GetMessageClass(file.message_types_by_name[name]) for name in _MESSAGES}


_CLASSES = _build()
QuorumMember = _CLASSES["QuorumMember"]
Quorum = _CLASSES["Quorum"]
LighthouseQuorumRequest = _CLASSES["LighthouseQuorumRequest"]
LighthouseQuorumResponse = _CLASSES["LighthouseQuorumResponse"]
LighthouseHeartbeatRequest = _CLASSES["LighthouseHeartbeatRequest"]
LighthouseHeartbeatResponse = _CLASSES["LighthouseHeartbeatResponse"]
