"""What TorchServe's two gRPC services share: messages from descriptors, statuses, the token.

Each service's messages are described in Python (:mod:`google.protobuf.descriptor_pb2`) with
TorchServe's package, names and field numbers, and made into classes in a private pool, so
the bytes on the wire are what stubs generated from TorchServe's ``.proto`` files send and
read, with no generated code in Weir.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, empty_pb2, message_factory

Context = grpc.aio.ServicerContext[Any, Any]
Field = descriptor_pb2.FieldDescriptorProto
# TorchServe's mapping of HTTP statuses to gRPC's (GRPCUtils.getGRPCStatusCode).
_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# Protobuf's scalar types by the names the message tables below use.
TYPES = {"string": Field.TYPE_STRING, "bytes": Field.TYPE_BYTES, "int32": Field.TYPE_INT32,
         "bool": Field.TYPE_BOOL}  # fmt: skip


def file_proto(package: str, name: str) -> descriptor_pb2.FileDescriptorProto:
    """An empty proto3 file of ``package``, that may use ``google.protobuf.Empty``."""
    return descriptor_pb2.FileDescriptorProto(
        name=f"weir/torchserve/{name}.proto",
        package=package,
        syntax="proto3",
        dependency=["google/protobuf/empty.proto"],
    )


def add_message(
    proto: descriptor_pb2.FileDescriptorProto, name: str, fields: list[tuple[str, str]]
) -> descriptor_pb2.DescriptorProto:
    """Add message ``name``: its fields, numbered from 1 in order, as (name, scalar type)."""
    message = proto.message_type.add(name=name)
    for number, (field_name, kind) in enumerate(fields, start=1):
        message.field.add(
            name=field_name, number=number, type=TYPES[kind], label=Field.LABEL_OPTIONAL
        )
    return message


def classes(proto: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """The message classes of ``proto``, by name."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(empty_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(proto)
    return {
        message.name: message_factory.GetMessageClass(
            pool.FindMessageTypeByName(f"{proto.package}.{message.name}")
        )
        for message in proto.message_type
    }


def status_code(http_status: int) -> grpc.StatusCode:
    """The gRPC status TorchServe answers an HTTP status with."""
    if 200 <= http_status < 300:
        return grpc.StatusCode.OK
    return _STATUS.get(http_status, grpc.StatusCode.INTERNAL)


def authorization(context: Context) -> str:
    """The call's ``authorization`` metadata entry, as an HTTP request's header."""
    for name, value in context.invocation_metadata() or ():
        if name == "authorization":
            return str(value)
    return ""
