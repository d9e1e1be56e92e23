"""A Handler script in Kapacitor's own Python API, batch -> stream: per batch, one point (at
the batch's tmax, with its name and tags) holding the mean of `field`; nothing for an empty batch."""

from kapacitor.udf import udf_pb2
from kapacitor.udf.agent import Agent, Handler


class MeanHandler(Handler):
    def __init__(self, agent):
        self._agent = agent
        self._field = None
        self._values = []

    def info(self):
        response = udf_pb2.Response()
        response.info.wants = udf_pb2.BATCH
        response.info.provides = udf_pb2.STREAM
        response.info.options["field"].valueTypes.append(udf_pb2.STRING)
        return response

    def init(self, init_req):
        for opt in init_req.options:
            if opt.name == "field":
                self._field = opt.values[0].stringValue
        response = udf_pb2.Response()
        response.init.success = self._field is not None
        response.init.error = "" if self._field else "must supply field"
        return response

    def snapshot(self):
        response = udf_pb2.Response()
        response.snapshot.snapshot = b""
        return response

    def restore(self, restore_req):
        response = udf_pb2.Response()
        response.restore.success = True
        return response

    def begin_batch(self, begin_req):
        self._values = []

    def point(self, point):
        self._values.append(point.fieldsDouble[self._field])

    def end_batch(self, end_req):
        if not self._values:
            return
        response = udf_pb2.Response()
        response.point.name = end_req.name
        response.point.time = end_req.tmax
        response.point.group = end_req.group
        response.point.tags.update(end_req.tags)
        response.point.fieldsDouble["mean"] = sum(self._values) / len(self._values)
        self._agent.write_response(response)


if __name__ == "__main__":
    agent = Agent()
    agent.handler = MeanHandler(agent)
    agent.start()
    agent.wait()
