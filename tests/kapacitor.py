from udf_agent.testing import *  # noqa: F401,F403
from udf_agent.testing import Duration, InProcessAgent, KapacitorDriver, SocketDriver, option  # noqa: F401
