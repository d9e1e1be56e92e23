"""Kapacitor's Python UDF API, as udf-agent provides it: scripts written for Kapacitor's own
Python agent (``from kapacitor.udf.agent import Agent, Handler``) run unmodified, their
handlers computed by udf-agent. See docs/migrating.md."""
