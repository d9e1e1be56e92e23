"""A Handler script in Kapacitor's own Python API whose handler kills the process it runs in at
its first point, as a crash in a C extension would: what its neighbours must never notice.

Only inside a Spark Python worker (where udf-agent runs handlers): anywhere else, such as a test
process that captured it for its Info, the point raises instead.
"""

import os
import signal

from kapacitor.udf import udf_pb2
from kapacitor.udf.agent import Agent, Handler


class CrashingHandler(Handler):
    def __init__(self, agent):
        self._agent = agent

    def info(self):
        response = udf_pb2.Response()
        response.info.wants = udf_pb2.STREAM
        response.info.provides = udf_pb2.STREAM
        return response

    def init(self, init_req):
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
        from pyspark import TaskContext

        if TaskContext.get() is None:  # set inside a Spark task, on Spark 3.5 and 4.x alike
            raise Exception("crasher.py crashes Spark Python workers only")
        os.kill(os.getpid(), signal.SIGKILL)

    def end_batch(self, end_req):
        raise Exception("not supported")


if __name__ == "__main__":
    a = Agent()
    a.handler = CrashingHandler(a)
    a.start()
    a.wait()
