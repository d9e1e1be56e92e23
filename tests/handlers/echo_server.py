"""A socket Handler script in Kapacitor's own Python API (as Kapacitor's mirror.py): echoes
every point, each connection its own agent and handler. Its socket path is argv[1]."""

import sys

from kapacitor.udf import udf_pb2
from kapacitor.udf.agent import Agent, Handler, Server


class EchoHandler(Handler):
    def __init__(self, agent, connection_number):
        self._agent = agent
        self._number = connection_number

    def info(self):
        response = udf_pb2.Response()
        response.info.wants = udf_pb2.STREAM
        response.info.provides = udf_pb2.STREAM
        return response

    def init(self, init_req):
        response = udf_pb2.Response()
        response.init.success = True
        return response

    def point(self, point):
        response = udf_pb2.Response()
        response.point.CopyFrom(point)
        response.point.fieldsInt["connection"] = self._number
        self._agent.write_response(response, True)


class Accepter:
    _count = 0

    def accept(self, conn, addr):
        self._count += 1
        agent = Agent(conn, conn)
        agent.handler = EchoHandler(agent, self._count)
        agent.start()
        agent.wait()


if __name__ == "__main__":
    Server(sys.argv[1], Accepter()).serve()
