"""Which UDF a task runs and how Kapacitor's Init bound it, sans-IO: the Info it answers, the
options its Init gave, and that Init's frame (what a checkpoint or a relay starts a task with).
"""

from __future__ import annotations

from udf_agent import udf_pb2
from udf_agent.api import UDFSpec
from udf_agent.options import OptionValues, option_info, parse_options
from udf_agent.wire.frames import encode_frame

_EDGE = {"stream": udf_pb2.STREAM, "batch": udf_pb2.BATCH}


class Binding:
    def __init__(self, spec: UDFSpec | None, allow_modules: tuple[str, ...]):
        self._spec = spec
        self.allow_modules = allow_modules
        self.options: OptionValues | None = None  # set by a successful Init
        self.init_frame: bytes | None = None  # that Init's frame

    @property
    def spec(self) -> UDFSpec:
        """The UDF; known before any request but a keepalive is acted on."""
        if self._spec is None:
            raise RuntimeError("the session's UDF is not known yet")
        return self._spec

    @property
    def known(self) -> bool:
        return self._spec is not None

    def adopt(self, spec: UDFSpec) -> None:
        self._spec = spec

    def info(self) -> udf_pb2.InfoResponse:
        if self.spec.handler is not None:
            return udf_pb2.InfoResponse.FromString(self.spec.handler.info)
        return udf_pb2.InfoResponse(wants=_EDGE[self.spec.wants], provides=_EDGE[self.spec.provides], options=option_info(self.spec.options))

    def bind(self, init: udf_pb2.InitRequest) -> tuple[UDFSpec, OptionValues]:
        """The UDF the task runs from now on (a ``stream_fn``/``batch_fn`` target names
        another) and Init's options, checked for it; ``api.BindError`` says why it cannot."""
        spec, options = self.spec.bind(list(init.options), self.allow_modules)
        self._spec, self.options = spec, options
        self.init_frame = encode_frame(udf_pb2.Request(init=init))
        return spec, options

    def bind_handler(self, init_frame: bytes) -> OptionValues:
        """A Handler script's Init: its handler checks its own options."""
        self.options, self.init_frame = parse_options((), []), init_frame
        return self.options
