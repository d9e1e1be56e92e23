"""The deployments: how connections reach agents, beyond one task's own process.

- ``socket_server``: ``serve``'s unix socket, one agent per connection (the shared server's
  too), and the server's side of ``udf-agent status`` (``status`` is the client's).
- ``shared``: where shared Spark servers live, and the relay's side of their handshake
  (join, start, remembered launches); ``shared_server``: the server's side.
- ``placement``: whether a ``run`` task relays, decided before its command line is parsed and after.
- ``relay_input``: a relayed task's input, read from the process's first moment; ``relay``: its
  output side and carry-overs; ``relay_link``: what the server sends it (output in chunks of
  whole frames, the task's log records, checkpoints).
- ``failover``: what a relay keeps to carry its task over to a new server, sans-IO.
- ``metrics``: Prometheus metrics of a server with many tasks.

``runtime`` keeps one connection's agent and imports nothing from here. This file imports
nothing: a task's relay imports this package, and must stay light (no pandas, numpy or Spark).
"""
