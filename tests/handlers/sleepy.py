"""A Handler script in Kapacitor's own Python API whose handler takes `seconds` over every point
(it answers each with the point itself): a slow neighbour."""

import time

from kapacitor.udf import udf_pb2
from kapacitor.udf.agent import Agent, Handler


class SleepyHandler(Handler):
    def __init__(self, agent):
        self._agent = agent
        self._seconds = 0.0

    def info(self):
        response = udf_pb2.Response()
        response.info.wants = udf_pb2.STREAM
        response.info.provides = udf_pb2.STREAM
        response.info.options["seconds"].valueTypes.append(udf_pb2.DOUBLE)
        return response

    def init(self, init_req):
        for opt in init_req.options:
            if opt.name == "seconds":
                self._seconds = opt.values[0].doubleValue
        response = udf_pb2.Response()
        response.init.success = True
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
        raise Exception("not supported")

    def point(self, point):
        time.sleep(self._seconds)
        response = udf_pb2.Response()
        response.point.CopyFrom(point)
        self._agent.write_response(response)

    def end_batch(self, end_req):
        raise Exception("not supported")


if __name__ == "__main__":
    a = Agent()
    a.handler = SleepyHandler(a)
    a.start()
    a.wait()
