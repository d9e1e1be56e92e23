"""A Handler script in Kapacitor's own Python API (stream -> stream), as its users write them.

Per point: the point with its group's count so far, and every `every`-th point of a group one
more point named "milestone"; nothing for a point with the int field `skip` set; an exception
for a negative `value`. Its state (the counts) travels in its snapshot as JSON.
"""

import json
import logging

from kapacitor.udf import udf_pb2
from kapacitor.udf.agent import Agent, Handler

logger = logging.getLogger()


class CounterHandler(Handler):
    def __init__(self, agent):
        self._agent = agent
        self._every = 0
        self._counts = {}

    def info(self):
        response = udf_pb2.Response()
        response.info.wants = udf_pb2.STREAM
        response.info.provides = udf_pb2.STREAM
        response.info.options["every"].valueTypes.append(udf_pb2.INT)
        return response

    def init(self, init_req):
        for opt in init_req.options:
            if opt.name == "every":
                self._every = opt.values[0].intValue
        response = udf_pb2.Response()
        response.init.success = self._every > 0
        response.init.error = "" if self._every > 0 else "every must be > 0"
        print("counter initialised: every", self._every)
        return response

    def snapshot(self):
        response = udf_pb2.Response()
        response.snapshot.snapshot = json.dumps(self._counts).encode()
        return response

    def restore(self, restore_req):
        response = udf_pb2.Response()
        try:
            self._counts = json.loads(restore_req.snapshot.decode())
            response.restore.success = True
        except ValueError as exc:
            response.restore.success = False
            response.restore.error = str(exc)
        return response

    def begin_batch(self, begin_req):
        raise Exception("not supported")

    def point(self, point):
        if point.fieldsInt.get("skip"):
            return
        if point.fieldsDouble.get("value", 0.0) < 0:
            raise ValueError("negative value " + str(point.fieldsDouble["value"]))
        count = self._counts.get(point.group, 0) + 1
        self._counts[point.group] = count
        response = udf_pb2.Response()
        response.point.CopyFrom(point)
        response.point.fieldsInt["count"] = count
        self._agent.write_response(response)
        if count % self._every == 0:
            milestone = udf_pb2.Response()
            milestone.point.name = "milestone"
            milestone.point.time = point.time
            milestone.point.group = point.group
            milestone.point.fieldsInt["count"] = count
            self._agent.write_response(milestone, True)

    def end_batch(self, end_req):
        raise Exception("not supported")


if __name__ == "__main__":
    a = Agent()
    h = CounterHandler(a)
    a.handler = h
    logger.info("Starting Agent")
    a.start()
    a.wait()
    logger.info("Agent finished")
