from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EdgeType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM: _ClassVar[EdgeType]
    BATCH: _ClassVar[EdgeType]

class ValueType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BOOL: _ClassVar[ValueType]
    INT: _ClassVar[ValueType]
    DOUBLE: _ClassVar[ValueType]
    STRING: _ClassVar[ValueType]
    DURATION: _ClassVar[ValueType]
STREAM: EdgeType
BATCH: EdgeType
BOOL: ValueType
INT: ValueType
DOUBLE: ValueType
STRING: ValueType
DURATION: ValueType

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("wants", "provides", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: OptionInfo
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[OptionInfo, _Mapping]] = ...) -> None: ...
    WANTS_FIELD_NUMBER: _ClassVar[int]
    PROVIDES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    wants: EdgeType
    provides: EdgeType
    options: _containers.MessageMap[str, OptionInfo]
    def __init__(self, wants: _Optional[_Union[EdgeType, str]] = ..., provides: _Optional[_Union[EdgeType, str]] = ..., options: _Optional[_Mapping[str, OptionInfo]] = ...) -> None: ...

class OptionInfo(_message.Message):
    __slots__ = ("valueTypes",)
    VALUETYPES_FIELD_NUMBER: _ClassVar[int]
    valueTypes: _containers.RepeatedScalarFieldContainer[ValueType]
    def __init__(self, valueTypes: _Optional[_Iterable[_Union[ValueType, str]]] = ...) -> None: ...

class InitRequest(_message.Message):
    __slots__ = ("options", "taskID", "nodeID")
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TASKID_FIELD_NUMBER: _ClassVar[int]
    NODEID_FIELD_NUMBER: _ClassVar[int]
    options: _containers.RepeatedCompositeFieldContainer[Option]
    taskID: str
    nodeID: str
    def __init__(self, options: _Optional[_Iterable[_Union[Option, _Mapping]]] = ..., taskID: _Optional[str] = ..., nodeID: _Optional[str] = ...) -> None: ...

class Option(_message.Message):
    __slots__ = ("name", "values")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    name: str
    values: _containers.RepeatedCompositeFieldContainer[OptionValue]
    def __init__(self, name: _Optional[str] = ..., values: _Optional[_Iterable[_Union[OptionValue, _Mapping]]] = ...) -> None: ...

class OptionValue(_message.Message):
    __slots__ = ("type", "boolValue", "intValue", "doubleValue", "stringValue", "durationValue")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BOOLVALUE_FIELD_NUMBER: _ClassVar[int]
    INTVALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLEVALUE_FIELD_NUMBER: _ClassVar[int]
    STRINGVALUE_FIELD_NUMBER: _ClassVar[int]
    DURATIONVALUE_FIELD_NUMBER: _ClassVar[int]
    type: ValueType
    boolValue: bool
    intValue: int
    doubleValue: float
    stringValue: str
    durationValue: int
    def __init__(self, type: _Optional[_Union[ValueType, str]] = ..., boolValue: bool = ..., intValue: _Optional[int] = ..., doubleValue: _Optional[float] = ..., stringValue: _Optional[str] = ..., durationValue: _Optional[int] = ...) -> None: ...

class InitResponse(_message.Message):
    __slots__ = ("success", "error")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    success: bool
    error: str
    def __init__(self, success: bool = ..., error: _Optional[str] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: bytes
    def __init__(self, snapshot: _Optional[bytes] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: bytes
    def __init__(self, snapshot: _Optional[bytes] = ...) -> None: ...

class RestoreResponse(_message.Message):
    __slots__ = ("success", "error")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    success: bool
    error: str
    def __init__(self, success: bool = ..., error: _Optional[str] = ...) -> None: ...

class KeepaliveRequest(_message.Message):
    __slots__ = ("time",)
    TIME_FIELD_NUMBER: _ClassVar[int]
    time: int
    def __init__(self, time: _Optional[int] = ...) -> None: ...

class KeepaliveResponse(_message.Message):
    __slots__ = ("time",)
    TIME_FIELD_NUMBER: _ClassVar[int]
    time: int
    def __init__(self, time: _Optional[int] = ...) -> None: ...

class ErrorResponse(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: str
    def __init__(self, error: _Optional[str] = ...) -> None: ...

class BeginBatch(_message.Message):
    __slots__ = ("name", "group", "tags", "size", "byName")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BYNAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    group: str
    tags: _containers.ScalarMap[str, str]
    size: int
    byName: bool
    def __init__(self, name: _Optional[str] = ..., group: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ..., size: _Optional[int] = ..., byName: bool = ...) -> None: ...

class Point(_message.Message):
    __slots__ = ("time", "name", "database", "retentionPolicy", "group", "dimensions", "tags", "fieldsDouble", "fieldsInt", "fieldsString", "byName", "fieldsBool")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class FieldsDoubleEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class FieldsIntEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class FieldsStringEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class FieldsBoolEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bool
        def __init__(self, key: _Optional[str] = ..., value: bool = ...) -> None: ...
    TIME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    RETENTIONPOLICY_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    FIELDSDOUBLE_FIELD_NUMBER: _ClassVar[int]
    FIELDSINT_FIELD_NUMBER: _ClassVar[int]
    FIELDSSTRING_FIELD_NUMBER: _ClassVar[int]
    BYNAME_FIELD_NUMBER: _ClassVar[int]
    FIELDSBOOL_FIELD_NUMBER: _ClassVar[int]
    time: int
    name: str
    database: str
    retentionPolicy: str
    group: str
    dimensions: _containers.RepeatedScalarFieldContainer[str]
    tags: _containers.ScalarMap[str, str]
    fieldsDouble: _containers.ScalarMap[str, float]
    fieldsInt: _containers.ScalarMap[str, int]
    fieldsString: _containers.ScalarMap[str, str]
    byName: bool
    fieldsBool: _containers.ScalarMap[str, bool]
    def __init__(self, time: _Optional[int] = ..., name: _Optional[str] = ..., database: _Optional[str] = ..., retentionPolicy: _Optional[str] = ..., group: _Optional[str] = ..., dimensions: _Optional[_Iterable[str]] = ..., tags: _Optional[_Mapping[str, str]] = ..., fieldsDouble: _Optional[_Mapping[str, float]] = ..., fieldsInt: _Optional[_Mapping[str, int]] = ..., fieldsString: _Optional[_Mapping[str, str]] = ..., byName: bool = ..., fieldsBool: _Optional[_Mapping[str, bool]] = ...) -> None: ...

class EndBatch(_message.Message):
    __slots__ = ("name", "group", "tmax", "tags", "byName")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TMAX_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    BYNAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    group: str
    tmax: int
    tags: _containers.ScalarMap[str, str]
    byName: bool
    def __init__(self, name: _Optional[str] = ..., group: _Optional[str] = ..., tmax: _Optional[int] = ..., tags: _Optional[_Mapping[str, str]] = ..., byName: bool = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("info", "init", "keepalive", "snapshot", "restore", "begin", "point", "end")
    INFO_FIELD_NUMBER: _ClassVar[int]
    INIT_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    info: InfoRequest
    init: InitRequest
    keepalive: KeepaliveRequest
    snapshot: SnapshotRequest
    restore: RestoreRequest
    begin: BeginBatch
    point: Point
    end: EndBatch
    def __init__(self, info: _Optional[_Union[InfoRequest, _Mapping]] = ..., init: _Optional[_Union[InitRequest, _Mapping]] = ..., keepalive: _Optional[_Union[KeepaliveRequest, _Mapping]] = ..., snapshot: _Optional[_Union[SnapshotRequest, _Mapping]] = ..., restore: _Optional[_Union[RestoreRequest, _Mapping]] = ..., begin: _Optional[_Union[BeginBatch, _Mapping]] = ..., point: _Optional[_Union[Point, _Mapping]] = ..., end: _Optional[_Union[EndBatch, _Mapping]] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("info", "init", "keepalive", "snapshot", "restore", "error", "begin", "point", "end")
    INFO_FIELD_NUMBER: _ClassVar[int]
    INIT_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    info: InfoResponse
    init: InitResponse
    keepalive: KeepaliveResponse
    snapshot: SnapshotResponse
    restore: RestoreResponse
    error: ErrorResponse
    begin: BeginBatch
    point: Point
    end: EndBatch
    def __init__(self, info: _Optional[_Union[InfoResponse, _Mapping]] = ..., init: _Optional[_Union[InitResponse, _Mapping]] = ..., keepalive: _Optional[_Union[KeepaliveResponse, _Mapping]] = ..., snapshot: _Optional[_Union[SnapshotResponse, _Mapping]] = ..., restore: _Optional[_Union[RestoreResponse, _Mapping]] = ..., error: _Optional[_Union[ErrorResponse, _Mapping]] = ..., begin: _Optional[_Union[BeginBatch, _Mapping]] = ..., point: _Optional[_Union[Point, _Mapping]] = ..., end: _Optional[_Union[EndBatch, _Mapping]] = ...) -> None: ...
