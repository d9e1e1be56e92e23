"""A Handler script that writes what would crash kapacitord, chosen by a point's string field `write`."""

from kapacitor.udf import udf_pb2
from kapacitor.udf.agent import Agent, Handler


class BadHandler(Handler):
    def __init__(self, agent):
        self._agent = agent

    def info(self):
        response = udf_pb2.Response()
        response.info.wants = udf_pb2.STREAM
        response.info.provides = udf_pb2.BATCH
        return response

    def init(self, init_req):
        response = udf_pb2.Response()
        response.init.success = True
        return response

    def point(self, point):
        what = point.fieldsString["write"]
        response = udf_pb2.Response()
        if what == "empty":
            pass
        elif what == "end":
            response.end.name = "x"
        elif what == "negative":
            response.begin.size = -1
        elif what == "init":
            response.init.success = True
        elif what == "batch":
            response.begin.name = "x"
            self._agent.write_response(response)
            response = udf_pb2.Response()
            response.end.name = "x"
        self._agent.write_response(response)


if __name__ == "__main__":
    agent = Agent()
    agent.handler = BadHandler(agent)
    agent.start()
    agent.wait()
